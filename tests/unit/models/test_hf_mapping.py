"""Megatron <-> HF fused layouts, checked against layouts built by hand from the definitions."""

import pytest
import torch

from megatron_rl.models.hf import (
    all_hf_names,
    hf_shape,
    hf_to_megatron_full,
    hf_to_megatron_shard,
    megatron_full_to_hf,
    tp_shard,
    tp_unshard,
)
from tests.helpers.specs import LLAMA_TINY_TIED, QWEN2_TINY, QWEN3_MOE_TINY, QWEN3_TINY


def _random_hf(spec, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(hf_shape(spec, n), generator=g) for n in all_hf_names(spec)}


def test_qkv_is_grouped_per_kv_group():
    spec = QWEN2_TINY  # 4 heads, 2 KV groups, head_dim 32
    hf = _random_hf(spec)
    full = hf_to_megatron_full(spec, "decoder.layers.0.self_attention.linear_qkv.weight", hf, 128)
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    # Group 0 = heads 0,1 of q, then k head 0, then v head 0; group 1 likewise.
    expected = torch.cat([q[0:64], k[0:32], v[0:32], q[64:128], k[32:64], v[32:64]])
    assert torch.equal(full, expected)
    # and plain stacking would differ
    assert not torch.equal(full, torch.cat([q, k, v]))


def test_fc1_shard_is_gate_r_then_up_r():
    spec = QWEN2_TINY
    hf = _random_hf(spec)
    name = "decoder.layers.1.mlp.linear_fc1.weight"
    full = hf_to_megatron_full(spec, name, hf, 128)
    gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    shard1 = tp_shard(spec, name, full, 2, 1)
    assert torch.equal(shard1, torch.cat([gate[128:], up[128:]]))


@pytest.mark.parametrize(
    "spec", [QWEN2_TINY, LLAMA_TINY_TIED, QWEN3_TINY, QWEN3_MOE_TINY], ids=lambda s: s.name
)
@pytest.mark.parametrize("tp", [1, 2])
def test_shards_from_hf_equal_shards_of_full_and_roundtrip(spec, tp):
    """(For an MoE model `tp` here also stands for the expert TP an expert's weights split over.)"""
    hf = _random_hf(spec)
    padded = spec.padded_vocab(tp)

    def read(n, dim, a, b):
        return hf[n] if dim is None else hf[n].narrow(dim, a, b - a)

    from megatron_rl.models.hf import megatron_names

    back = {}
    for name in megatron_names(spec, range(spec.num_layers), True, True):
        full = hf_to_megatron_full(spec, name, hf, padded)
        shards = [hf_to_megatron_shard(spec, name, read, tp, r, padded) for r in range(tp)]
        for r in range(tp):
            assert torch.equal(shards[r], tp_shard(spec, name, full, tp, r)), (name, r)
        assert torch.equal(tp_unshard(spec, name, shards), full)
        back.update(megatron_full_to_hf(spec, name, full))
    assert set(back) == set(hf)
    for n in hf:
        assert torch.equal(back[n], hf[n]), n


def test_vocab_padding_rows_are_zero_and_removed_on_export():
    spec = QWEN2_TINY  # vocab 100 -> 128 at TP2 (multiple of 32 x 2)
    assert spec.padded_vocab(2) == 128 and spec.padded_vocab(1) == 128 and spec.padded_vocab(4) == 128
    hf = _random_hf(spec)
    full = hf_to_megatron_full(spec, "embedding.word_embeddings.weight", hf, 128)
    assert full.shape == (128, 128) and torch.all(full[100:] == 0)
    assert (
        megatron_full_to_hf(spec, "embedding.word_embeddings.weight", full)[
            "model.embed_tokens.weight"
        ].shape[0]
        == 100
    )
