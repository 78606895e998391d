"""Tokens and FLOPs against the hand model (see hand.py for its counts)."""

from __future__ import annotations

import pytest

from megatron_rl.plan.flops import (
    attention_fwd_flops,
    decode_context_sum,
    decode_flops_per_sample,
    logprob_forward_flops,
    prefill_flops,
    recompute_extra_flops,
    tokens_per_step,
    train_flops,
)
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.run import resolve

from .hand import hand_inputs


def test_model_counts_by_hand():
    inp = hand_inputs()
    assert inp.spec.layer_params() == 152
    assert inp.params == 388
    assert inp.matmul_params == 344
    assert inp.weights_bytes == 776
    assert inp.kv_bytes_per_token == 16


def test_tokens_per_step():
    # 4 samples; prompt 1 token each (2 unique prompts), completion 2, sequence 3.
    t = tokens_per_step(hand_inputs())
    assert (t["sequences"], t["prompt"], t["prompt_unique"], t["completion"], t["trained"]) == (
        4,
        4,
        2,
        8,
        12,
    )


def test_attention_term_is_the_sum_over_query_positions():
    # Query at position t (1-based) attends to t keys; per layer Q.K^T costs 2·t·q_size and the
    # weighted sum of V as much: summed explicitly over a 3-token sequence, 2 layers, q_size 4.
    inp = hand_inputs()
    explicit = sum(2 * (2 * t * 4 + 2 * t * 4) for t in range(1, 4))
    assert explicit == 192
    assert attention_fwd_flops(inp, 3) == 192


def test_train_and_logprob_flops_by_hand():
    inp = hand_inputs()
    # per sequence: 6 x 344 x 3 + 3 x 192 = 6,192 + 576 = 6,768; 4 sequences.
    assert train_flops(inp) == 4 * 6768
    # forward: 2 x 344 x 3 + 192 = 2,256 per sequence, old and reference each.
    lp = logprob_forward_flops(inp)
    assert lp["old"] == lp["ref"] == 4 * 2256
    assert lp["total"] == 8 * 2256
    no_kl = logprob_forward_flops(hand_inputs(work={"reference_forward": False}))
    assert no_kl["ref"] == 0 and no_kl["total"] == 4 * 2256
    # algorithm.old_logprobs: the update's own forward or the engines' log-probs stand in for the pass.
    no_old = logprob_forward_flops(hand_inputs(work={"old_forward": False}))
    assert no_old["old"] == 0 and no_old["total"] == 4 * 2256


@pytest.mark.parametrize(
    "overrides, old_forward",
    [
        ([], True),  # 4 minibatches: auto recomputes
        (["algorithm.minibatches=1"], False),  # one minibatch: the update's forward is the old policy's
        (["algorithm.minibatches=1", "algorithm.old_logprobs=recompute"], True),
        (["algorithm.minibatches=1", "algorithm.kl_in_reward=true"], True),  # KL before the update
        (["algorithm.old_logprobs=engine"], False),
    ],
)
def test_the_planner_counts_the_old_forward_the_driver_runs(overrides, old_forward):
    from megatron_rl.config.load import load_recipe
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.plan.cycle import trainer_phases

    recipe = load_recipe("grpo_qwen2.5-32b_32n8g", overrides)
    inp = inputs_from_run(resolve(recipe))
    assert inp.work.old_forward is old_forward
    phases = trainer_phases(inp, ParallelLayout.from_config(recipe.layout))
    assert (phases["old_logprobs"] > 0) is old_forward


def test_recompute_adds_the_forward_it_redoes():
    inp = hand_inputs()
    assert recompute_extra_flops(inp, "none") == 0
    assert recompute_extra_flops(inp, "selective") == 4 * 192  # attention forward again
    # full: every layer's forward (2 x 2 layers x 152 params x 3 tokens) and attention.
    assert recompute_extra_flops(inp, "full") == 4 * (2 * 2 * 152 * 3 + 192)


def test_prefill_with_and_without_prefix_sharing():
    inp = hand_inputs()
    # one prompt of 1 token: 2 x 344 x 1 + attention 2 x 2 x 4 x 1 x 2 = 688 + 32 = 720.
    assert prefill_flops(inp, shared=True) == 2 * 720
    assert prefill_flops(inp, shared=False) == 4 * 720


def test_decode_reads_and_flops():
    # completion token i reads the p + i cached tokens before it: p=1, c=2 -> 1 + 2 = 3.
    assert decode_context_sum(1, 2) == 3
    assert decode_context_sum(1, 4) == 1 + 2 + 3 + 4
    inp = hand_inputs()
    # 2 tokens x 2 x 344 + 4 x 2 layers x 4 x 3 context = 1,376 + 96.
    assert decode_flops_per_sample(inp, 2) == pytest.approx(1376 + 96)
