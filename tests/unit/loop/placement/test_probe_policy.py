"""What a disagreeing probe does to a publication, over a real Publisher and the reference sink.

The probe here is an oracle of the same contract as loop/placement/probe.py's: it compares what the sink serves
after activation with what the trainer's own weights convert to (reshard/oracle.py), so a conversion
fault injected upstream of the transfer (reshard/faults.py) -- which every checksum passes -- is seen,
and the refusal policy's answer to it is what is tested: the version is refused, the one before it
serves again byte for byte, and the run ends after `max_refused_publications` in a row."""

from __future__ import annotations

import pytest
import torch

from megatron_rl.loop.placement.probe import ProbeVerdict, step_problems
from megatron_rl.loop.placement.publication import PublicationRefused, RefusalPolicy
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.faults import FaultInjector
from megatron_rl.reshard.publish import InMemorySink, Publisher
from megatron_rl.rollout.agreement import thresholds_for
from tests.helpers.specs import QWEN2_TINY as SPEC
from tests.unit.reshard.oracle import expected_engine_tensors, random_hf
from tests.unit.reshard.test_publish_local import _trainer

T32 = thresholds_for("fp32", "fp32")


class OracleProbe:
    """Served tensors against the ones the trainer's weights convert to (max |diff| as the 'gap')."""

    def __init__(self, sink: InMemorySink, hf_of_version):
        self.sink, self.hf_of_version, self.calls = sink, hf_of_version, []

    def __call__(self, version: int) -> ProbeVerdict:
        self.calls.append(version)
        want = expected_engine_tensors(SPEC, self.hf_of_version(version), "loader", 1, 0)
        gap = max(float((self.sink.tensors()[n] - want[n]).abs().max()) for n in want)
        stats = {"max_abs_diff": gap, "mean_abs_diff": gap, "tokens": 1, "nonfinite_tokens": 0}
        bad = (
            []
            if gap <= T32.max_gap
            else [f"engine 0: max |trainer - engine| {gap:.3g} nats > {T32.max_gap:.3g}"]
        )
        return ProbeVerdict(version, not bad, bad, stats, {0: stats})


def _setup(faults: dict[int, str], policy="stop", action="refuse", max_in_a_row=3):
    hf = random_hf(SPEC)
    params = _trainer(hf)
    sink = InMemorySink()
    pub = Publisher(ParallelLayout(), SPEC, sink, delivery="loader")
    guard = RefusalPolicy(pub, policy, max_in_a_row, action, T32)
    inj = FaultInjector(faults, SPEC, tp=1)
    named = inj.wrap(params.items, lambda: pub.next_version)
    return hf, sink, guard, named, OracleProbe(sink, lambda v: hf)


def test_a_disagreeing_version_is_refused_and_the_one_before_serves_again():
    hf, sink, guard, named, probe = _setup({2: "gate_up"})
    assert guard.publish(named, 0, probe).activated
    served_v1 = {n: t.clone() for n, t in sink.tensors().items()}
    r = guard.publish(named, 1, probe)
    assert probe.calls == [1, 2] and not r.activated and r.version == 2
    assert r.probe["passed"] is False and r.probe["max_abs_diff"] > T32.max_gap
    assert "log-prob probe (fp32 trainer, fp32 engine): engine 0: max |trainer - engine|" in r.problems[0]
    assert sink.active_version == 1 and r.active_version == 1 and guard.publisher.last_activated == 1
    assert r.action == "sampled with the active version 1" and guard.in_a_row == 1
    assert all(torch.equal(sink.tensors()[n], served_v1[n]) for n in served_v1)
    assert guard.publish(named, 2, probe).activated and sink.active_version == 3  # a clean one activates


def test_refusals_in_a_row_end_the_run_under_the_default_policy():
    _, sink, guard, named, probe = _setup({2: "gate_up", 3: "zero_proj", 4: "qkv_heads"})
    guard.publish(named, 0, probe)
    guard.publish(named, 1, probe)
    guard.publish(named, 2, probe)
    with pytest.raises(PublicationRefused, match="refused 3 times in a row(.|\n)*log-prob probe"):
        guard.publish(named, 3, probe)
    assert sink.active_version == 1


def test_a_first_version_that_disagrees_leaves_nothing_to_serve():
    _, sink, guard, named, probe = _setup({1: "zero_proj", 2: "zero_proj", 3: "zero_proj"})
    with pytest.raises(PublicationRefused, match="no version was ever activated"):
        guard.publish(named, 0, probe)  # nothing serves: retried at once, three times
    assert probe.calls == [1, 2, 3] and sink.active_version is None


def test_warn_serves_the_version_and_stop_ends_at_once():
    _, sink, guard, named, probe = _setup({2: "gate_up"}, action="warn")
    guard.publish(named, 0, probe)
    r = guard.publish(named, 1, probe)
    assert r.activated and sink.active_version == 2 and r.probe["passed"] is False
    _, sink, guard, named, probe = _setup({2: "gate_up"}, action="stop")
    guard.publish(named, 0, probe)
    with pytest.raises(PublicationRefused, match="step 2: version 2: .*disagree.*the run stops"):
        guard.publish(named, 1, probe)


def test_the_steps_own_disagreement_ends_the_run_when_it_persists(caplog):
    _, _, guard, _, _ = _setup({})
    wrong = ["max |trainer - engine| 0.3 nats > 2e-05"]
    assert guard.after_step(0, 1, []) == ""
    with caplog.at_level("WARNING"):
        assert guard.after_step(0, 1, wrong) == "" and guard.steps_disagreeing == 1
    assert caplog.messages[-1].endswith(": 1 step in a row"), caplog.messages
    assert guard.after_step(1, 2, []) == "" and guard.steps_disagreeing == 0  # an outlier between agreements
    assert guard.after_step(2, 3, wrong) == "" and guard.after_step(3, 4, wrong) == ""
    assert "3 steps in a row disagree" in guard.after_step(4, 5, wrong)
    assert guard.in_a_row == 0  # publications were not refused
    _, _, stop, _, _ = _setup({}, action="stop")
    assert "the run stops" in stop.after_step(0, 1, wrong)
    _, _, warn, _, _ = _setup({}, action="warn")
    assert all(warn.after_step(s, s + 1, wrong) == "" for s in range(5))


def test_the_step_check_fails_closed_and_judges_lag_zero_batches_only():
    def agreement(max_gap, tokens=10, nonfinite=0, lag=0):
        return dict(
            max_abs_diff=max_gap,
            mean_abs_diff=max_gap / 4,
            tokens=tokens,
            nonfinite_tokens=nonfinite,
            version_lag=lag,
        )

    assert step_problems(agreement(1e-6), T32, None) == []
    assert step_problems(agreement(1e-2), T32, None)[0].startswith("max |trainer - engine| 0.01")
    assert step_problems(agreement(1e-2, lag=1), T32, None) == []  # an older version: drift, not a fault
    assert "no token was compared" in step_problems(agreement(float("nan"), tokens=0), T32, None)[0]
    assert any("probability 0" in p for p in step_problems(agreement(1e-6, nonfinite=2), T32, None))
