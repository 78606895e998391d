"""Memory per GPU, by hand on the reference model (Qwen2.5-32B, TP8 PP2 DP16, engines TP4)."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_rl.plan import memory_per_gpu
from megatron_rl.plan.inputs import GIB
from megatron_rl.plan.memory import (
    activation_bytes_per_layer_token,
    engine_memory,
    memory_fit,
    trainer_memory,
)
from megatron_rl.run import resolve

# One layer: QKV 5120 x (5120 + 2 x 1024) + bias 7168 = 36,707,328; proj 5120^2 = 26,214,400;
# SwiGLU 3 x 5120 x 27648 = 424,673,280; norms 2 x 5120 -> 487,605,248.
LAYER = 487_605_248
VOCAB_TP8 = 152_576  # 152,064 padded to a multiple of 128 x 8
STAGE0_PER_GPU = (32 * LAYER + VOCAB_TP8 * 5120) / 8  # 32 layers + embedding, TP8 -> 2,048,069,632
LONGEST = 2048 + 16384  # prompt cap + completion cap


def test_trainer_parts_by_hand(ref):
    inp, layout = ref
    assert inp.spec.layer_params() == LAYER
    m = trainer_memory(inp, layout)
    assert (m["stage"], m["stages"]) == (0, 2)
    assert m["params"] == pytest.approx(STAGE0_PER_GPU * 2)
    assert m["grads"] == pytest.approx(STAGE0_PER_GPU * 4)
    assert m["optimizer"] == pytest.approx(STAGE0_PER_GPU * 12 / 16)  # sharded over DP16
    # selective, sequence parallel: (4h + 2q + 2kv + 3f) / TP elements x 2 B per layer and token.
    per_token_layer = (4 * 5120 + 2 * 5120 + 2 * 1024 + 3 * 27648) / 8 * 2
    assert per_token_layer == 28_928
    # 32 layers x the longest sequence x 2 microbatches in flight on the first 1F1B stage.
    assert m["in_flight_microbatches"] == 2
    assert m["activations"] == pytest.approx(per_token_layer * LONGEST * 32 * 2)
    assert m["logits"] == 0.0  # on the last stage, which is lighter here
    assert m["runtime"] == 3 * GIB
    # The recipe's KL needs a frozen reference, resident by default: its weights, the stage's params.
    assert m["reference"] == pytest.approx(m["params"])
    parts = ("params", "grads", "optimizer", "activations", "logits", "reference", "runtime")
    assert m["total"] == pytest.approx(sum(m[k] for k in parts))


def test_recompute_modes_order_and_full_formula(ref):
    inp, layout = ref
    none = activation_bytes_per_layer_token(inp, layout, "none")
    sel = activation_bytes_per_layer_token(inp, layout, "selective")
    full = activation_bytes_per_layer_token(inp, layout, "full")
    # none adds the softmax output: 40 heads / 8 x S elements per token, 2 B each.
    assert none - sel == pytest.approx(40 / 8 * LONGEST * 2)
    assert full == pytest.approx(5120 / 8 * 2)  # only the layer input, SP-sharded
    m_full = trainer_memory(inp, layout, "full")
    # With so little kept, the last stage (it holds the fp32 log-softmax, 18,432 x 152,576 / 8 x 6 B)
    # is the heavier one: 32 layer inputs of one microbatch + one layer being recomputed.
    assert m_full["stage"] == 1
    assert m_full["logits"] == pytest.approx(LONGEST * VOCAB_TP8 / 8 * (4 + 2))
    assert m_full["activations"] == pytest.approx(full * 32 * LONGEST + sel * LONGEST)


def test_engine_parts_by_hand(ref):
    inp, layout = ref
    e = engine_memory(inp, layout)
    weights = 65_527_752_704 / 4
    assert e["weights"] == pytest.approx(weights)
    assert e["kv_cache"] == pytest.approx(0.6 * 80 * GIB - weights - 3 * GIB)
    assert e["total"] == pytest.approx(0.6 * 80 * GIB)
    # 8 KV heads over TP4: each GPU holds 2 of them, 262,144 / 4 B per token.
    assert e["kv_tokens_per_engine"] == int(e["kv_cache"] // (262_144 / 4))
    assert not e["reasons"]


def test_layout_that_does_not_fit_is_rejected_with_the_reason(ref):
    inp, layout = ref
    fit = memory_fit(inp, layout.with_(tp=1, pp=1, dp=256), recompute="none")
    assert not fit["fits"]
    assert any(r.startswith("trainer needs") and "> 80 GiB with recompute none" in r for r in fit["reasons"])
    tp1_engines = memory_fit(inp, layout.with_(engine_tp=1, engine_count=256))
    assert any("leave no KV cache" in r and "engine TP1" in r for r in tp1_engines["reasons"])
    greedy = dataclasses.replace(inp, assume=dataclasses.replace(inp.assume, gpu_memory_utilization=0.97))
    crowded = memory_fit(greedy, layout)
    assert any("lower rollout.gpu_memory_utilization" in r for r in crowded["reasons"])


def test_memory_per_gpu_for_validate(ref_recipe, ref):
    inp, layout = ref
    mem = memory_per_gpu(resolve(ref_recipe))
    assert mem["fits"] and mem["reasons"] == []
    assert mem["trainer_per_gpu"] == pytest.approx(trainer_memory(inp, layout)["total"] / GIB)
    assert mem["engine_per_gpu"] == pytest.approx(48.0)
    assert mem["gpu_memory_gib"] == 80.0
    assert set(mem["activations_by_recompute"]) == {"none", "selective", "full"}
    assert mem["peak_per_gpu"] <= 80.0


def test_uneven_pipeline_split_loads_the_bigger_stage(ref):
    inp, layout = ref
    m = trainer_memory(inp, layout.with_(pp_layers=(24, 40)))
    # stage 1: 40 layers + output layer + final norm, TP8; one microbatch in flight plus the logits.
    assert m["stage"] == 1 and m["in_flight_microbatches"] == 1
    assert m["params"] == pytest.approx((40 * LAYER + VOCAB_TP8 * 5120 + 5120) / 8 * 2)
    assert m["activations"] == pytest.approx(28_928 * LONGEST * 40)


def test_bad_pipeline_split_is_refused(capsys):
    from megatron_rl.cli.plan import main

    assert main(["grpo_qwen2.5-32b_32n8g", "layout.pp_layers=[30,30]", "--no-search"]) == 2
    assert (
        "layout.pp_layers=[30, 30]: needs layout.pp=2 entries (each >= 1) summing to model.num_layers=64"
        in (capsys.readouterr().err)
    )
