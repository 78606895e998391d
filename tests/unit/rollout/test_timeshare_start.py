"""Building the colocated engine: the trainer comes back only once the new engine sleeps (TimeShare.start).

The trainer's offload hooks are megatron-core's (GPU only), and the CPU build of vLLM never sleeps, so the
order is recorded on small stand-ins with the same methods, with CUDA reported present."""

import pytest

from megatron_rl.loop.placement import timeshare
from megatron_rl.loop.placement.timeshare import TimeShare


class Recorder:
    def __init__(self, events, name, **methods):
        self.offload_between_uses = False
        for method in methods.get("calls", ()):
            setattr(self, method, self._record(events, f"{name}.{method}"))

    @staticmethod
    def _record(events, what):
        def call(*args, **kwargs):
            events.append(what)
            return True

        return call


@pytest.fixture
def events(monkeypatch):
    monkeypatch.setattr(timeshare.torch.cuda, "is_available", lambda: True)
    return []


def test_the_engine_sleeps_before_the_trainer_comes_back(events):
    optimizer = Recorder(events, "optimizer", calls=("offload_to_cpu", "restore_from_cpu"))
    ddp = Recorder(events, "ddp", calls=("offload_grad_buffers", "restore_grad_buffers"))
    reference = Recorder(events, "reference", calls=("weights_to_host", "weights_to_device"))
    engine = Recorder(events, "engine", calls=("sleep", "wake_up"))

    def build():
        events.append("engine.built")
        return engine

    ts = TimeShare.start(build, optimizer, ddp, reference)
    assert ts.engine is engine
    assert events == [
        "optimizer.offload_to_cpu",
        "ddp.offload_grad_buffers",
        "reference.weights_to_host",
        "engine.built",
        "engine.sleep",  # asleep (KV cache and weights freed) ...
        "reference.weights_to_device",  # ... before any trainer state returns to the device
        "ddp.restore_grad_buffers",
        "optimizer.restore_from_cpu",
    ]


def test_a_failed_build_still_brings_the_trainer_back(events):
    optimizer = Recorder(events, "optimizer", calls=("offload_to_cpu", "restore_from_cpu"))

    def build():
        raise RuntimeError("vLLM: not enough free memory")

    with pytest.raises(RuntimeError, match="free memory"):
        TimeShare.start(build, optimizer)
    assert events == ["optimizer.offload_to_cpu", "optimizer.restore_from_cpu"]
