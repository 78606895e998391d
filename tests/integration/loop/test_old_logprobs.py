"""algorithm.old_logprobs end to end on the tiny recipe: with one minibatch, `auto` drops the old-policy
forward and trains exactly as `recompute` does (same seeds, same rewards, same agreement); `engine` takes
the engines' log-probs at two minibatches. In every case the engine-vs-trainer agreement is measured."""

import pytest

from tests.helpers.tiny_run import launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("old_logprobs")
    cases = {
        "auto": ["algorithm.minibatches=1", "algorithm.old_logprobs=auto"],
        "recompute": ["algorithm.minibatches=1", "algorithm.old_logprobs=recompute"],
        "engine": ["algorithm.minibatches=2", "algorithm.old_logprobs=engine"],
    }
    for name, extra in cases.items():
        launch(tmp, STEPS, [*extra, "algorithm.kl_coef=0.04", "logger.wandb=false"], name=name)
    return {name: records(tmp, name) for name in cases}


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
