"""The tiny recipe end to end for a few steps: real megatron-core (TP2), real vLLM (CPU build),
real sandboxed rewards, real resharding. Checks the step records the telemetry writes (the run is
conftest.py's `tiny_run`, KL on; the loop under the device guard: test_guarded_loop.py). One launch:
`make test-quick` runs this file."""

import math

import pytest

from megatron_rl.telemetry.phases import PHASES
from tests.helpers.tiny_run import TINY_STEPS as STEPS
from tests.helpers.tiny_run import assert_no_alarm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_every_step_recorded_with_every_phase(tiny_run):
    _, recs = tiny_run
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for r in recs:
        assert set(r["phases"]) == set(PHASES)
        for name in (
            "generation",
            "scoring",
            "old_logprobs",
            "ref_logprobs",
            "train_fwd_bwd",
            "optimizer",
            "publish",
        ):
            assert r["phases"][name]["seconds"] > 0, (r["step"], name)
    assert recs[0]["phases"]["init"]["seconds"] > 0


def test_memory_is_the_max_over_every_rank(tiny_run):
    _, recs = tiny_run
    for r in recs:
        for name, ph in r["phases"].items():
            by_rank = ph["mem_gib_by_rank"]
            assert len(by_rank) == 2, "one entry per rank"
            assert ph["mem_gib"] == pytest.approx(max(by_rank), abs=1e-5), (r["step"], name)
            assert len(ph["seconds_by_rank"]) == 2
    # Both ranks measured something in the heavy phases (not rank 0's value copied).
    gen = recs[-1]["phases"]["generation"]["mem_gib_by_rank"]
    assert all(m > 0.1 for m in gen)


def test_versions_increase_by_one_per_step(tiny_run):
    _, recs = tiny_run
    versions = [r["version"] for r in recs]
    assert all(isinstance(v, int) for v in versions), versions
    assert [b - a for a, b in zip(versions, versions[1:])] == [1] * (STEPS - 1)
    assert all(r["published_version"] == r["version"] for r in recs), (
        "each step samples the version published at its start"
    )
    assert all(r["publication"]["activated"] for r in recs)
    assert_no_alarm(recs)  # every version probed before it served, none refused


def test_logprob_agreement_finite_and_within_tolerance(tiny_run):
    _, recs = tiny_run
    for r in recs:
        a = r["logprob_agreement"]
        assert math.isfinite(a["max_abs_diff"]) and math.isfinite(a["mean_abs_diff"])
        assert a["max_abs_diff"] < 1e-3, a


def test_rewards_kl_and_throughput_are_recorded(tiny_run):
    _, recs = tiny_run
    for r in recs:
        assert 0.0 <= r["reward"]["mean"] <= 1.0
        assert sum(r["reward"]["statuses"].values()) == 16
        assert r["train"]["kl"] >= 0 and math.isfinite(r["train"]["grad_norm"])
        assert r["throughput"]["generated_tokens_per_s"] > 0
        # the pool's whole time after generation holds the part the step waited (the scoring phase): the
        # record's rank 0 measured both; the phase's `seconds` is the slowest rank's, which may wait longer
        sc, phase = r["scoring"], r["phases"]["scoring"]
        assert sc["after_generation_s"] >= sc["exposed_s"] >= 0 and sc["busy_s"] > 0
        assert sc["exposed_s"] == pytest.approx(phase["seconds_by_rank"][0], abs=0.01)
        assert sc["exposed_s"] <= phase["seconds"] + 0.01


def test_wandb_offline_run_holds_the_metrics(tiny_run):
    tmp, _ = tiny_run
    files = list((tmp / "outputs" / "tiny").rglob("run-*.wandb"))
    assert files, "no offline W&B run was written"
    blob = files[0].read_bytes()
    for key in (b"reward/mean", b"phases/generation/seconds", b"logprob_agreement/max_abs_diff"):
        assert key in blob, key


def test_timeline_png_written(tiny_run):
    tmp, _ = tiny_run
    png = tmp / "outputs" / "tiny" / "timeline.png"
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"
