"""The tiny MoE recipe (grpo_tiny_moe_cpu) end to end: a Qwen3-MoE model (4 experts, top-2) trained
by megatron-core at DP2 x EP2 (the all-gather dispatcher over gloo), served by two vLLM CPU engines that
receive the experts from both EP ranks every step, rewards from the sandbox, routing replay on (the
trainer's forwards use the experts the engines recorded per token). Its rewards climb, and the
engines serve exactly the trainer's weights: a publication whose experts the engine left unpacked
(rollout/moe_reload.py) read 0.07 nats mean / 0.37 max here before it was mended."""

import pytest

from tests.helpers.tiny_run import assert_no_alarm, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = 8
# The recipe's own batch (8 prompts x 8 samples, 4 minibatches of 16 over DP2) instead of the fast one.
RECIPE_BATCH = ["data.prompts_per_step=8", "rollout.samples_per_prompt=8", "algorithm.minibatches=4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    # With routing replay: every forward takes the engine's experts (fp32 on both sides: the same ones).
    extra = [*RECIPE_BATCH, "algorithm.routing_replay=true"]
    launch(tmp, STEPS, extra, recipe="grpo_tiny_moe_cpu", env={"MEGATRON_RL_DEVICE_GUARD": "1"})
    return records(tmp)


def test_the_moe_policy_learns(run):
    rewards = [r["reward"]["mean"] for r in run]
    print("rewards", [round(x, 3) for x in rewards])
    assert len(run) == STEPS
    first, last = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
    assert last >= first + 0.1, f"rewards did not climb: first two {first:.3f}, last three {last:.3f}"


def test_engines_serve_the_trainers_experts(run):
    assert_no_alarm(run)
    for r in run:
        a = r["logprob_agreement"]
        assert r["publication"]["activated"], r["step"]
        # fp32 on both sides: the same weights give the same log-probs to rounding.
        assert a["max_abs_diff"] <= 1e-4, (r["step"], a)
