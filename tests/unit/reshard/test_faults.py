"""The conversion faults of reshard/faults.py: each changes exactly what it names, on the last layer, in
a copy (the trainer's parameters are never touched), and only in the version it was chosen for."""

from __future__ import annotations

import pytest
import torch

from megatron_rl.models.hf import megatron_names
from megatron_rl.reshard.faults import DENSE, ENV, MOE, FaultInjector, parse
from tests.helpers.specs import QWEN2_TINY, QWEN3_MOE_TINY
from tests.unit.reshard.oracle import megatron_shard, random_hf

L1 = "decoder.layers.1."


def _params(spec):
    hf = random_hf(spec)
    padded = spec.padded_vocab(1)
    return {
        n: megatron_shard(spec, hf, n, 1, 0, padded).clone()
        for n in megatron_names(spec, range(2), True, True)
    }


def _changed(spec, fault: str) -> tuple[dict, dict, set[str]]:
    params = _params(spec)
    before = {n: t.clone() for n, t in params.items()}
    inj = FaultInjector({2: fault}, spec, tp=1)
    assert dict(inj.apply(params.items(), 1)).keys() == params.keys()  # version 1: clean, and remembered
    out = dict(inj.apply(params.items(), 2))
    assert all(torch.equal(params[n], before[n]) for n in params), "the parameters themselves changed"
    changed = {n for n in params if not torch.equal(out[n], params[n])}
    return params, out, changed


def test_qkv_heads_swaps_two_query_heads_of_one_layer():
    params, out, changed = _changed(QWEN2_TINY, "qkv_heads")
    assert changed == {L1 + "self_attention.linear_qkv.weight", L1 + "self_attention.linear_qkv.bias"}
    hd, w = QWEN2_TINY.head_dim, params[L1 + "self_attention.linear_qkv.weight"]
    got = out[L1 + "self_attention.linear_qkv.weight"]
    assert torch.equal(got[:hd], w[hd : 2 * hd]) and torch.equal(got[hd : 2 * hd], w[:hd])
    assert torch.equal(got[2 * hd :], w[2 * hd :])


def test_gate_up_swaps_the_halves_of_fc1():
    params, out, changed = _changed(QWEN2_TINY, "gate_up")
    name = L1 + "mlp.linear_fc1.weight"
    assert changed == {name}
    half = params[name].shape[0] // 2
    assert torch.equal(out[name][:half], params[name][half:])


def test_noise_is_small_and_relative():
    params, out, changed = _changed(QWEN2_TINY, "noise")
    name = L1 + "mlp.linear_fc2.weight"
    assert changed == {name}
    rel = ((out[name] - params[name]) / params[name]).abs()
    assert 1e-5 < rel.median() < 1e-2


def test_zero_proj_and_stale_layer():
    _, out, changed = _changed(QWEN2_TINY, "zero_proj")
    assert changed == {L1 + "self_attention.linear_proj.weight"}
    assert not out[L1 + "self_attention.linear_proj.weight"].any()
    params = _params(QWEN2_TINY)
    inj = FaultInjector({3: "stale_layer"}, QWEN2_TINY, tp=1)
    first = {n: t.clone() for n, t in params.items()}
    list(inj.apply(params.items(), 1))
    for t in params.values():  # a training step moves every weight
        t.add_(0.5)
    out = dict(inj.apply(params.items(), 3))
    for n in params:
        want = first[n] if n.startswith(L1) else params[n]
        assert torch.equal(out[n], want), n


def test_expert_faults_touch_the_named_experts_only():
    _, out, changed = _changed(QWEN3_MOE_TINY, "expert_swap")
    e = L1 + "mlp.experts.local_experts."
    assert changed == {e + f"{j}.linear_fc{k}.weight" for j in (0, 1) for k in (1, 2)}
    params, out, changed = _changed(QWEN3_MOE_TINY, "expert_slice")
    assert changed == {e + "0.linear_fc1.weight"}
    _, _, changed = _changed(QWEN3_MOE_TINY, "gate_up")  # every expert's fc1 on an MoE layer
    assert changed == {e + f"{j}.linear_fc1.weight" for j in range(4)}


def test_the_plan_is_parsed_strictly():
    assert parse("qkv_heads@2, gate_up@3") == {2: "qkv_heads", 3: "gate_up"}
    for bad in ("qkv@2", "gate_up", "gate_up@0", "noise@x"):
        with pytest.raises(ValueError, match=ENV):
            parse(bad)
    assert set(DENSE) | set(MOE) == {
        "qkv_heads", "gate_up", "stale_layer", "noise", "zero_proj", "expert_swap", "expert_slice"
    }  # fmt: skip
