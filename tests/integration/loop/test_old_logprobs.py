"""algorithm.old_logprobs end to end on the tiny recipe: with one minibatch, `auto` drops the old-policy
forward and trains exactly as `recompute` does (same seeds, same rewards, same agreement); `engine` takes
the engines' log-probs at two minibatches. In every case the engine-vs-trainer agreement is measured.

The `recompute` run is conftest.py's `tiny_run` (one minibatch, KL 0.04); `auto` takes its settings
(tests/helpers/tiny_run.py TINY) with old_logprobs=auto, so only that differs between the two. The
`engine` run is conftest.py's `engine_run` (KL 0.04, dynamic sampling, under the device guard)."""

import pytest

from tests.helpers.tiny_run import ENGINE_STEPS, TINY, TINY_STEPS, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = TINY_STEPS
assert ENGINE_STEPS == STEPS


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_run, engine_run):
    tmp = tmp_path_factory.mktemp("old_logprobs")
    launch(tmp, STEPS, [*TINY, "algorithm.old_logprobs=auto"], name="auto")
    return {"auto": records(tmp, "auto"), "recompute": tiny_run[1], "engine": engine_run[1]}


def test_auto_skips_the_old_forward_and_trains_as_recompute_does(runs):
    auto, recompute = runs["auto"], runs["recompute"]
    assert [r["old_logprobs"] for r in auto] == ["update_forward"] * STEPS
    assert [r["old_logprobs"] for r in recompute] == ["recompute"] * STEPS
    assert all("old_logprobs" not in r["phases"] or r["phases"]["old_logprobs"]["seconds"] == 0 for r in auto)
    assert all(r["phases"]["old_logprobs"]["seconds"] > 0 for r in recompute)
    for a, b in zip(auto, recompute):
        # Same seeds, same weights: the same samples and rewards, step after step.
        assert a["reward"]["mean"] == pytest.approx(b["reward"]["mean"], abs=1e-6), a["step"]
        assert a["train"]["loss"] == pytest.approx(b["train"]["loss"], rel=1e-4, abs=1e-6), a["step"]
        assert a["train"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        # The agreement is measured on every sample either way, and agrees.
        ga, gb = a["logprob_agreement"], b["logprob_agreement"]
        assert ga["tokens"] == gb["tokens"] > 0
        assert ga["max_abs_diff"] == pytest.approx(gb["max_abs_diff"], abs=1e-5)
        assert ga["beyond_threshold"] == [] and ga["max_abs_diff"] < 1e-3


def test_engine_logprobs_stand_in_and_the_agreement_is_still_measured(runs):
    eng = runs["engine"]
    assert [r["old_logprobs"] for r in eng] == ["engine"] * STEPS
    for r in eng:
        assert "old_logprobs" not in r["phases"] or r["phases"]["old_logprobs"]["seconds"] == 0
        g = r["logprob_agreement"]
        # The first of two minibatches: half of this rank's samples, checked before any update.
        assert g["sequences"] > 0 and g["beyond_threshold"] == [] and g["max_abs_diff"] < 1e-3
        # Against the behaviour policy the ratios are finite (the second minibatch follows an update).
        assert 0.0 < r["train"]["ratio_mean"] < float("inf")
