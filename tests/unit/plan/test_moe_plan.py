"""Mixture of experts in the planner: FLOPs from the active parameters, memory from all of them, the
expert-parallel all-to-all by network cut, and the shipped Qwen3-30B-A3B recipe validated and planned."""

from __future__ import annotations

import dataclasses
import json

import pytest

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.alltoall import alltoall, step_alltoall
from megatron_rl.plan.flops import train_flops
from megatron_rl.plan.inputs import GIB, PlanInputs, inputs_from_run
from megatron_rl.plan.memory import trainer_memory
from megatron_rl.run import resolve

from .hand import HAND_LAYOUT, hand_inputs

RECIPE = "grpo_qwen3-30b-a3b_4n8g"


def _moe(inp: PlanInputs, **kw) -> PlanInputs:
    """The hand model with a mixture-of-experts MLP (hidden 4): `kw` sets the experts."""
    spec = dataclasses.replace(inp.spec, family="qwen3_moe", **kw)
    return dataclasses.replace(inp, spec=spec)


# Router 6 x 4 = 24 + top-2 experts of 3 x 4 x 2 = 24 each: 72 active MLP params per layer, the same
# as a dense SwiGLU of FFN 6 (3 x 4 x 6 = 72); all six experts hold 24 + 6 x 24 = 168.
EXPERTS = dict(num_experts=6, moe_topk=2, moe_ffn_hidden_size=2)


def _pair() -> tuple[PlanInputs, PlanInputs]:
    base = hand_inputs()
    dense = dataclasses.replace(base, spec=dataclasses.replace(base.spec, ffn_hidden_size=6))
    return dense, _moe(base, **EXPERTS)


def test_flops_follow_active_params_and_memory_follows_total():
    dense, moe = _pair()
    assert moe.spec.mlp_params(active=True) == dense.spec.mlp_params() == 72
    assert moe.spec.mlp_params() == 168
    assert moe.active_params == dense.params and moe.params == dense.params + 2 * (168 - 72)
    assert moe.matmul_params == dense.matmul_params
    assert train_flops(moe) == train_flops(dense)
    # Memory holds every expert: params bytes are the whole model at TP1 EP1 (bf16).
    vocab = moe.spec.padded_vocab(1)
    assert trainer_memory(moe, HAND_LAYOUT)["params"] == moe.spec.num_params(vocab) * 2
    assert trainer_memory(dense, HAND_LAYOUT)["params"] == dense.spec.num_params(vocab) * 2
    # EP2 over DP4: experts halve per GPU; their optimizer state shards over expert-DP 2, the rest over DP 4.
    lay = HAND_LAYOUT.with_(dp=4, ep=2)
    experts = 2 * 6 * 24
    rest = moe.spec.num_params(vocab) - experts
    mem = trainer_memory(moe, lay)
    assert mem["params"] == (rest + experts / 2) * 2
    assert mem["optimizer"] == pytest.approx(rest * 12 / 4 + experts / 2 * 12 / 2)
    # The engine's KV cache is attention's alone, as dense.
    assert moe.kv_bytes_per_token == dense.kv_bytes_per_token == 16


def test_decode_reads_only_the_experts_a_batch_routes_to():
    dense, moe = _pair()
    assert dense.decode_weight_bytes(1) == dense.decode_weight_bytes(1000) == dense.weights_bytes
    one = moe.decode_weight_bytes(1)  # the dense part and 2 of 6 experts per layer
    assert one == (moe.params - 2 * 6 * 24 + 2 * 2 * 24) * 2
    assert one < moe.decode_weight_bytes(4) < moe.weights_bytes
    assert moe.decode_weight_bytes(10_000) == pytest.approx(moe.weights_bytes)


def test_alltoall_bytes_by_cut():
    # Hand case: top-2 of 4 experts, hidden 4, bf16; 3 tokens per rank per microbatch (1 + 2), 2 layers.
    four = dict(num_experts=4, moe_topk=2, moe_ffn_hidden_size=2)
    inp = _moe(hand_inputs(hw={"nodes": 2}), **four)
    lay = HAND_LAYOUT.with_(dp=4, ep=4)
    copies = 3 * 2 * 4 * 2  # tokens x top-k x hidden x bytes = 48 B per layer and all-to-all
    # 2 GPUs per node: EP4 spans 2 nodes; a rank keeps 1/4, sends 1/4 over NVLink and 2/4 over IB.
    one = alltoall(inp, lay, microbatches=1, passes=1)  # one all-to-all in each of the 2 layers
    assert (one["nvlink_bytes"], one["ib_bytes"]) == (2 * copies / 4, 2 * 2 * copies / 4) == (24, 48)
    train = step_alltoall(inp, lay)["phases"]["train_fwd_bwd"]
    assert train["count"] == 1 * 2 * 4  # 1 microbatch x 2 layers x (dispatch, combine) x (fwd, bwd)
    assert (train["nvlink_bytes"], train["ib_bytes"], train["ib_bytes_per_node"]) == (96, 192, 384)
    # IB 384 B at 10 B/s per node is slower than NVLink 96 B at 100 B/s; plus 8 latencies of 8 us.
    assert train["seconds"] == pytest.approx(38.4 + 8 * 8e-6)
    # The EP group inside one node of 4: nothing crosses IB.
    inside = alltoall(_moe(hand_inputs(hw={"gpus_per_node": 4}), **four), lay, microbatches=1, passes=1)
    assert inside["ib_bytes"] == 0 and inside["nvlink_bytes"] == 2 * 3 * copies / 4 == 72
    # EP1: tokens never leave the rank; a dense model has no all-to-all at all.
    assert step_alltoall(inp, lay.with_(ep=1))["nvlink_bytes"] == 0
    assert step_alltoall(hand_inputs(), lay)["seconds"] == 0


def test_shipped_recipe_at_ep8_inside_and_across_nodes():
    from megatron_rl.config.load import load_recipe

    inp = inputs_from_run(resolve(load_recipe(RECIPE)))
    lay = ParallelLayout.from_config(load_recipe(RECIPE).layout)
    assert (lay.tp, lay.ep, lay.etp) == (2, 8, 1)
    inside = step_alltoall(inp, lay)
    assert inside["nvlink_bytes"] > 0 and inside["ib_bytes"] == 0  # EP8 = one node of 8
    across = step_alltoall(inp, lay.with_(ep=16, pp=1, dp=16))
    assert across["ib_bytes"] > 0  # EP16 spans two nodes
    assert step_alltoall(inp, lay.with_(ep=1))["seconds"] == 0


def test_shipped_recipe_validates_and_plans(capsys):
    from megatron_rl.cli.plan import main as plan
    from megatron_rl.cli.recipes import validate

    assert validate([RECIPE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert plan([RECIPE, "--json", "--no-search"]) == 0
    report = json.loads(capsys.readouterr().out)
    model, mem = report["model"], report["memory_gib"]
    assert 30.0e9 < model["params"] < 31.0e9 and 3.2e9 < model["active_params"] < 3.5e9
    assert (model["experts"], model["experts_per_token"]) == (128, 8)
    assert mem["fits"] and mem["peak_per_gpu"] <= 80.0 and mem["gpu_memory"] == 80.0
    assert report["alltoall"]["ep"] == 8 and report["alltoall"]["nvlink_bytes"] > 0
    assert plan([RECIPE, "--no-search"]) == 0
    text = capsys.readouterr().out
    assert "active per token" in text and "MoE all-to-all (EP8)" in text and "DOES NOT FIT" not in text


def test_ep_that_does_not_divide_the_experts_is_refused():
    from megatron_rl.check.recipe import ConfigError, validate_recipe
    from megatron_rl.config.load import load_recipe

    with pytest.raises(ConfigError) as e:
        validate_recipe(load_recipe(RECIPE, ["layout.ep=5"]), "validate")
    msgs = [str(p) for p in e.value.problems if p.key == "layout.ep"]
    assert any("must divide model.num_experts=128" in m for m in msgs), msgs


def test_dense_plan_has_no_moe_sections(ref):
    from megatron_rl.plan.report import build_report

    inp, layout = ref
    data = build_report(inp, layout, with_search=False).to_json()
    assert "alltoall" not in data and "active_params" not in data["model"]
    assert trainer_memory(inp, layout)["params"] / GIB > 0


def test_the_moe_training_time_follows_the_expert_gemms_that_run():
    """A GPU cluster runs transformer-engine's grouped expert GEMMs (inside the assumed MFU); a CPU cluster
    (the local spec) one GEMM per expert, launch-bound: PER_EXPERT_FORWARD_S per local expert, MoE layer
    and microbatch forward, twice that backward (models/experts.py, plan/cycle.py)."""
    import math

    from megatron_rl.config.load import load_recipe
    from megatron_rl.plan.cycle import trainer_phases
    from megatron_rl.plan.inputs import PER_EXPERT_FORWARD_S

    gpu = inputs_from_run(resolve(load_recipe(RECIPE)))
    assert gpu.assume.expert_gemm == "grouped"
    assert inputs_from_run(resolve(load_recipe("grpo_tiny_moe_cpu"))).assume.expert_gemm == "per_expert"
    lay = ParallelLayout.from_config(load_recipe(RECIPE).layout)
    per_expert = dataclasses.replace(gpu, assume=dataclasses.replace(gpu.assume, expert_gemm="per_expert"))
    grouped, per = trainer_phases(gpu, lay), trainer_phases(per_expert, lay)
    w, s = gpu.work, gpu.spec
    local_expert_layers = (s.num_layers // lay.pp) * (s.num_experts // lay.ep)  # 24 x 16 on this layout

    def microbatches(sequences: int) -> int:
        return math.ceil(math.ceil(sequences / lay.dp) / w.micro_batch_size)

    one = local_expert_layers * PER_EXPERT_FORWARD_S
    train = w.minibatches * microbatches(w.samples // w.minibatches) * one * 3  # forward + 2 x backward
    assert per["train_fwd_bwd"] - grouped["train_fwd_bwd"] == pytest.approx(train)
    assert per["ref_logprobs"] - grouped["ref_logprobs"] == pytest.approx(microbatches(w.samples) * one)
    assert per["optimizer"] == grouped["optimizer"]
