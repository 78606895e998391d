"""Publications are split into vLLM's fused groups, and a split group is refused."""

import re

import pytest
import torch

from megatron_rl.models.hf import all_hf_names
from megatron_rl.rollout.weights import fused_group_key, group_fused
from tests.helpers.specs import LLAMA_TINY_TIED, QWEN2_TINY
from tests.unit.reshard.oracle import random_hf


def _named(names):
    return [(n, torch.zeros(1)) for n in names]


@pytest.mark.parametrize("spec", [QWEN2_TINY, LLAMA_TINY_TIED], ids=lambda s: s.name)
def test_every_model_tensor_lands_in_exactly_one_whole_group(spec):
    names = all_hf_names(spec)
    groups = group_fused(_named(names))
    assert sorted(n for g in groups for n, _ in g) == sorted(names)
    qkv = [g for g in groups if fused_group_key(g[0][0]).endswith(".qkv")]
    gate_up = [g for g in groups if fused_group_key(g[0][0]).endswith(".gate_up")]
    assert len(qkv) == len(gate_up) == spec.num_layers
    assert {len(g) for g in qkv} == {6 if spec.qkv_bias else 3}
    assert {len(g) for g in gate_up} == {2}


def test_groups_keep_publication_order_and_hand_the_tensors_through():
    # What each reload call receives: the caller's own tensors (no copy), q/k/v weights then biases
    # of a layer together, gate before up, and groups in the order their first member was published.
    spec = QWEN2_TINY
    hf = random_hf(spec)
    groups = group_fused(hf.items())
    assert groups[0][0][0] == next(iter(hf))
    qkv = [g for g in groups if any("q_proj" in n for n, _ in g)]
    assert [n for n, _ in qkv[0]] == [
        f"model.layers.0.self_attn.{x}_proj.{k}" for k in ("weight", "bias") for x in "qkv"
    ]
    gate_up = [g for g in groups if any("gate_proj" in n for n, _ in g)]
    assert all(g[0][0].endswith("gate_proj.weight") and g[1][0].endswith("up_proj.weight") for g in gate_up)
    assert all(t is hf[n] for g in groups for n, t in g)
    flat = [n for g in groups for n, _ in g]
    assert len(flat) == len(set(flat)) == len(hf)


def test_group_keys():
    assert fused_group_key("model.layers.3.self_attn.k_proj.bias") == "model.layers.3.qkv"
    assert fused_group_key("model.layers.3.mlp.up_proj.weight") == "model.layers.3.gate_up"
    assert (
        fused_group_key("model.layers.3.self_attn.o_proj.weight") == "model.layers.3.self_attn.o_proj.weight"
    )
    assert fused_group_key("lm_head.weight") == "lm_head.weight"


def test_split_groups_and_duplicates_are_refused():
    names = [n for n in all_hf_names(QWEN2_TINY) if n != "model.layers.1.self_attn.v_proj.bias"]
    with pytest.raises(
        ValueError, match=r"model.layers.1.qkv.*missing \['model.layers.1.self_attn.v_proj.bias'\]"
    ):
        group_fused(_named(names))
    with pytest.raises(ValueError, match="gate_up.*up_proj"):
        group_fused(_named(["model.layers.0.mlp.gate_proj.weight"]))
    with pytest.raises(ValueError, match="appears twice"):
        group_fused(_named(["lm_head.weight", "lm_head.weight"]))


def _experts(layer, experts, skip=()):
    return [f"model.layers.{layer}.mlp.experts.{e}.{x}_proj.weight" for e in range(experts)
            for x in ("gate", "up", "down") if (e, x) not in skip]  # fmt: skip


def test_every_expert_of_a_layer_reloads_in_one_call():
    names = ["model.layers.0.mlp.gate.weight", *_experts(0, 4), *_experts(1, 4)]
    groups = group_fused(_named(names), num_experts=4)
    keys = [sorted({n.split(".mlp.")[0] for n, _ in g}) + [len(g)] for g in groups]
    assert keys == [["model.layers.0", 1], ["model.layers.0", 12], ["model.layers.1", 12]]


@pytest.mark.parametrize(
    "names,missing",
    [
        (
            _experts(0, 4, skip={(3, "gate"), (3, "up"), (3, "down")}),
            "model.layers.0.mlp.experts.3.down_proj",
        ),
        (_experts(0, 4, skip={(1, "up")}), "model.layers.0.mlp.experts.1.up_proj"),
    ],
)
def test_a_layer_missing_an_expert_or_a_projection_is_refused(names, missing):
    with pytest.raises(ValueError, match=f"incomplete: missing .*{re.escape(missing)}"):
        group_fused(_named(names), num_experts=4)


def test_expert_tensors_for_an_engine_without_experts_are_refused():
    with pytest.raises(ValueError, match="an engine that holds no experts"):
        group_fused(_named(_experts(0, 2)))
