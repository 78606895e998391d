"""The tiny loop under the device guard (trainer/device_guard.py: a tensor made without a device, a host
tensor on a device group, a big object over one fails here as it would on a GPU), with the engines'
log-probs as the old ones and dynamic sampling: conftest.py's `engine_run`, whose old log-probs
test_old_logprobs.py checks."""

import pytest

from tests.helpers.tiny_run import ENGINE_STEPS as STEPS

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_the_loop_ran_under_the_device_guard(engine_run):
    tmp, recs = engine_run
    # The ranks share the launcher's environment; the terminal shows the warning once.
    assert "device guard installed" in (tmp / "engine.log").read_text()
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))


def test_dynamic_sampling_keeps_the_batch_full(engine_run):
    _, recs = engine_run
    assert len(recs) == STEPS
    for r in recs:
        assert r["sampling_rounds"] >= 1
        assert sum(r["reward"]["statuses"].values()) == 16, "the batch keeps its shape"
