"""Time-sharing one device between the trainer and the colocated engine.

Per step, colocated:

    to_rollout:  trainer offloads optimizer state and gradient buffers
                 -> engine wakes its weights -> publish the new version -> engine wakes its KV cache
    (generate)
    to_train:    engine sleeps (weights offloaded or discarded, KV cache freed)
                 -> trainer brings optimizer state and gradient buffers back
    (old log-probs, train)

Waking the weights before the KV cache lets the publication land while the KV cache does not yet
hold memory. The model parameters themselves stay on the device: scoring the samples needs them.
The engine is put to sleep as soon as time-sharing starts, so the first publication follows the
same order as every later one (not an awake engine holding its KV cache while the policy lands).

Building the engine: vLLM claims gpu_memory_utilization x the GPU at construction and refuses to
start when less is free, so `trainer_aside(...)` offloads optimizer state, gradient buffers and the
reference's weights around the construction and until the new engine is asleep (`TimeShare.start`;
the planner checks that moment: plan/memory.py).

On GPU the trainer side uses megatron-core's own RL hooks (`MegatronOptimizer.offload_to_cpu`, here
with the model's own weights kept on the device, and `restore_from_cpu`;
`DistributedDataParallel.offload_grad_buffers` / `restore_grad_buffers`). On CPU
trainer and engine share host memory, so moving state "to the host" frees nothing and the engine
cannot sleep: both sides log that once and do nothing; the memory of each phase is still recorded.

PPO's critic trains beside the policy: its optimizer state and gradient buffers go aside and come back
with the policy's (`also`: more (optimizer, DDP) pairs), its weights stay, as the policy's do. A learned
reward model lives on the host between its uses (trainer/build.py), as an offloaded reference does.

Memory is reported through a hook the loop supplies, `on_memory(phase, snapshot)`; the telemetry
(max over ranks, the step record) is the loop's.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from megatron_rl.rollout.types import Engine

log = logging.getLogger(__name__)

MemoryHook = Callable[[str, dict[str, float]], None]
GIB = 2**30


def memory_snapshot() -> dict[str, float]:
    """Device memory on GPU (allocator and whole device, so vLLM's own pool counts), RSS on CPU."""
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return dict(
            device_used_gib=(total - free) / GIB,
            allocated_gib=torch.cuda.memory_allocated() / GIB,
            reserved_gib=torch.cuda.memory_reserved() / GIB,
            peak_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
        )
    import psutil

    return dict(
        rss_gib=psutil.Process().memory_info().rss / GIB,
        peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
    )


def offload_optimizer(optimizer, keep: set[int]) -> None:
    """megatron-core's `MegatronOptimizer.offload_to_cpu` (optimizer.py, 0.16.1), except for the
    parameters in `keep` (ids): the model's own.

    megatron-core moves `p.data` of every parameter in the optimizer's groups to the host, then every
    state tensor. With mixed precision or the distributed optimizer those parameters are fp32 main
    copies (or shards) and the model's weights stay on the device; with `FP32Optimizer` (fp32 weights,
    optim.distributed_optimizer=false) they *are* the model's weights, and the engine's next
    publication, which runs while the trainer is offloaded, would read host tensors (over NCCL). Here
    those stay; the state still moves. An optimizer that holds none of them keeps megatron-core's own
    method. `restore_from_cpu` needs no twin: it brings back only what is on the host."""
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(sub, "optimizer", None)
        groups = (
            inner.param_groups if inner is not None and not getattr(sub, "is_stub_optimizer", False) else []
        )
        if not any(id(p) in keep for g in groups for p in g["params"]):
            sub.offload_to_cpu()
            continue
        for group in groups:
            for p in group["params"]:
                if isinstance(p, torch.Tensor) and p.is_cuda and id(p) not in keep:
                    p.data = p.data.cpu()
        for state in inner.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and v.is_cuda:
                    state[k] = v.cpu()
        torch.cuda.empty_cache()


def offload_trainer(optimizer, ddp) -> bool:
    """Move optimizer state and free gradient buffers; True if device memory was released. The model's
    weights stay on the device (`offload_optimizer`)."""
    if not torch.cuda.is_available():
        return False
    if optimizer is not None:
        model = getattr(ddp, "module", None)  # megatron-core DistributedDataParallel wraps the model
        offload_optimizer(optimizer, {id(p) for p in model.parameters()} if model is not None else set())
    if ddp is not None:
        ddp.offload_grad_buffers()
    return True


def restore_trainer(optimizer, ddp) -> bool:
    """Inverse of offload_trainer (gradient buffers come back zeroed)."""
    if not torch.cuda.is_available():
        return False
    if ddp is not None:
        ddp.restore_grad_buffers()
    if optimizer is not None:
        optimizer.restore_from_cpu()
    return True


@contextmanager
def trainer_aside(optimizer=None, ddp=None, reference=None, also=()) -> Iterator[bool]:
    """Inside: optimizer state and gradient buffers offloaded (the policy's, and those of `also`: the
    critic's (optimizer, DDP)), the reference's weights on the host. After: the trainer restored (the
    reference stays on the host if it lives there between uses). Yields whether device memory was
    released (False on CPU, where nothing is)."""
    released = offload_trainer(optimizer, ddp)
    for opt, wrapped in also:
        released = offload_trainer(opt, wrapped) or released
    if reference is not None:
        released = reference.weights_to_host() or released
    try:
        yield released
    finally:
        if reference is not None and not reference.offload_between_uses:
            reference.weights_to_device()
        restore_trainer(optimizer, ddp)
        for opt, wrapped in also:
            restore_trainer(opt, wrapped)


class TimeShare:
    """Switches the device between rollout and training, recording memory at each switch."""

    def __init__(
        self, engine: Engine, optimizer=None, ddp=None, on_memory: MemoryHook | None = None, also=()
    ):
        self.engine, self.optimizer, self.ddp = engine, optimizer, ddp
        self.also = tuple(also)  # the critic's (optimizer, DDP): aside and back with the policy's
        self.on_memory = on_memory
        self._told = False
        self._serving = False  # the engine's KV cache is awake (between ready_to_serve and to_train)
        # A new engine is awake with its KV cache allocated: asleep, the first `to_rollout` wakes the
        # weights, publishes, then wakes the KV cache, like every later step.
        self.engine.sleep()

    @classmethod
    def start(
        cls,
        build: Callable[[], Engine],
        optimizer=None,
        ddp=None,
        reference=None,
        on_memory: MemoryHook | None = None,
        also=(),
    ) -> TimeShare:
        """Build the engine with the trainer aside, and put it to sleep before the trainer comes back.

        A new engine is awake (weights and gpu_memory_utilization x the GPU claimed); restoring the
        optimizer state, gradient buffers and reference weights beside it would not fit (70B: trainer
        state + 0.6 x 80 GiB), so the trainer returns only once the engine sleeps."""
        with trainer_aside(optimizer, ddp, reference, also):
            return cls(build(), optimizer, ddp, on_memory, also)

    def _record(self, phase: str) -> None:
        if self.on_memory is not None:
            self.on_memory(phase, memory_snapshot())

    def _note_cpu(self) -> None:
        if not self._told and not torch.cuda.is_available():
            log.info(
                "time-sharing on CPU: trainer and engine share host memory, so no state is offloaded and the "
                "engine does not sleep; memory per phase is still recorded"
            )
            self._told = True

    def to_rollout(self, publish: Callable[[], object] | None = None) -> object:
        """Trainer offloads, engine wakes weights, `publish()` runs, engine wakes its KV cache.

        Returns what `publish()` returned (the publication's result), or None."""
        self._note_cpu()
        self._record("train_end")
        offload_trainer(self.optimizer, self.ddp)
        for opt, wrapped in self.also:
            offload_trainer(opt, wrapped)
        self._record("trainer_offloaded")
        self.engine.wake_up(["weights"])
        self._serving = False
        result = publish() if publish is not None else None
        self.ready_to_serve()
        return result

    def ready_to_serve(self) -> None:
        """The publication has landed: the engine wakes its KV cache (once per `to_rollout`). Called by
        `to_rollout` after `publish()`, or from inside it by whatever must generate before it returns (the
        log-prob probe of the version just activated, loop/placement/probe.py)."""
        if self._serving:
            return
        self._record("published")
        self.engine.wake_up(["kv_cache"])
        self._record("rollout_start")
        self._serving = True

    def to_train(self) -> None:
        """Engine sleeps, trainer restores optimizer state and gradient buffers."""
        self._note_cpu()
        self._record("rollout_end")
        self.engine.sleep()
        self._record("engine_asleep")
        restore_trainer(self.optimizer, self.ddp)
        for opt, wrapped in self.also:
            restore_trainer(opt, wrapped)
        self._record("train_start")
