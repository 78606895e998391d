"""rollout.oversample on the tiny recipe (two colocated engines): each step draws ceil(1.5 x 4) = 6
prompts, trains on the first 4 groups to finish (2 per engine) with all their samples, and records the
8 samples cut or dropped with the 2 groups that finished last."""

import json

import pytest

from tests.helpers.tiny_run import VERBOSE_STEPS, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_oversampled_steps_train_full_groups_of_the_first_prompts_to_finish(verbose_oversampled_run):
    """conftest.py's `verbose_oversampled_run` (rollout.oversample=1.5; no KL, a verbose terminal)."""
    _, over = verbose_oversampled_run
    assert [r["step"] for r in over] == list(range(1, VERBOSE_STEPS + 1))
    for r in over:
        assert r["generation"]["prompts_drawn"] == 6 and r["generation"]["samples_dropped"] == 8
        # 4 prompts x 4 samples trained, every group whole (group advantages need all n)
        assert r["reward"]["statuses"] and sum(r["reward"]["statuses"].values()) == 16
        assert r["logprob_agreement"]["sequences"] > 0 and r["logprob_agreement"]["beyond_threshold"] == []
        assert r["scoring"]["remote_retries"] == 0  # a healthy fleet: every sample sent once


def test_a_recipe_with_endpoints_scores_on_the_fleet(verbose_oversampled_run):
    """The run's reward.endpoints named one reward-server: it scored every trained sample (and those of
        the groups the quota dropped that had finished): had the engine leaders scored in sandboxes of their
    own, the server would count none."""
    tmp, over = verbose_oversampled_run
    health = json.loads((tmp / "fleet_health.json").read_text())
    trained = sum(sum(r["reward"]["statuses"].values()) for r in over)
    assert trained <= health["scored"] <= trained + sum(r["generation"]["samples_dropped"] for r in over)


def test_partial_rollouts_on_two_colocated_engines_carry_and_continue_the_cut_groups(tmp_path):
    """The same layout with rollout.partial on the long-tailed task: each engine deals its share of the
    carried groups, and every rank holds the same carry (a rank that disagreed would submit other
    requests on its engine and hang or diverge)."""
    tail = ["data.tail_share=0.25", "data.short_answer_tokens=2", "rollout.max_new_tokens=12"]
    over = ["rollout.oversample=1.5", "rollout.partial=true", "algorithm.truncated_is_cap=2.0"]
    launch(tmp_path, 5, [*over, *tail, "rollout.stop_token_ids=[]", "logger.wandb=false"], name="partial")
    recs = records(tmp_path, "partial")
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    for r in recs:
        g = r["generation"]
        assert g["samples_dropped"] == 0  # nothing dropped: cut groups are carried
        assert sum(r["reward"]["statuses"].values()) == 16  # 4 whole groups of 4
        assert r["version_lag"]["max"] <= 2  # rollout.partial_max_cuts
    assert recs[0]["generation"]["prompts_drawn"] == 6
    assert sum(r["generation"]["samples_continued"] for r in recs) > 0
    assert sum(r["generation"]["tokens_from_earlier_batches"] for r in recs) > 0
    assert any(isinstance(r["version"], list) for r in recs)  # a batch whose samples span versions
