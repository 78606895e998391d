"""rollout.oversample on the tiny recipe (two colocated engines): each step draws ceil(1.5 x 4) = 6
prompts, trains on the first 4 groups to finish (2 per engine) with all their samples, and records the
8 samples cut or dropped with the 2 groups that finished last."""

import pytest

from tests.helpers.tiny_run import launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_oversampled_steps_train_full_groups_of_the_first_prompts_to_finish(tmp_path):
    launch(tmp_path, 2, ["rollout.oversample=1.5", "logger.wandb=false"], name="over")
    over = records(tmp_path, "over")
    for r in over:
        assert r["generation"]["prompts_drawn"] == 6 and r["generation"]["samples_dropped"] == 8
        # 4 prompts x 4 samples trained, every group whole (group advantages need all n)
        assert r["reward"]["statuses"] and sum(r["reward"]["statuses"].values()) == 16
        assert r["logprob_agreement"]["sequences"] > 0 and r["logprob_agreement"]["beyond_threshold"] == []
