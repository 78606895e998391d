"""Run layouts (convert.py) against hf.py's megatron sharding and an independent slicing of vLLM's rules."""

from dataclasses import replace

import pytest
import torch

from megatron_rl.models.hf import megatron_names
from megatron_rl.reshard.convert import (
    bytes_equal,
    check_engine_tp,
    engine_layouts,
    materialize,
    megatron_layout,
    to_hf,
)
from tests.helpers.specs import LLAMA_TINY_TIED, QWEN2_TINY, QWEN3_TINY
from tests.unit.reshard.oracle import expected_engine_tensors, megatron_shard, random_hf

# 8 heads in 2 KV groups: engine TP 4 and 8 replicate KV heads; vocab 100 pads differently per side.
GQA8 = replace(QWEN2_TINY, name="gqa8", num_attention_heads=8, head_dim=16, num_query_groups=2)
SPECS = [QWEN2_TINY, LLAMA_TINY_TIED, QWEN3_TINY, GQA8]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_layout_matches_hf_to_megatron_shard(spec, tp):
    hf = random_hf(spec)
    padded = spec.padded_vocab(tp)
    for name in megatron_names(spec, range(spec.num_layers), True, True):
        for rank in range(tp):
            lay = megatron_layout(spec, name, tp, rank, padded)
            assert bytes_equal(materialize(lay, hf), megatron_shard(spec, hf, name, tp, rank, padded)), name


# Engine TP up to 8 where the heads allow it (GQA8 at TP4 and TP8 replicates its 2 KV heads).
ENGINE_CASES = [(s, etp) for s in SPECS for etp in (1, 2, 4, 8) if s.num_attention_heads % etp == 0]


@pytest.mark.parametrize("spec,etp", ENGINE_CASES, ids=lambda x: getattr(x, "name", x))
@pytest.mark.parametrize("delivery", ["inplace", "loader"])
def test_engine_layouts_match_vllm_rules_and_invert(spec, etp, delivery):
    hf = random_hf(spec, seed=1)
    per_rank, layouts = [], []
    for t in range(etp):
        lays = engine_layouts(spec, delivery, etp, t)
        got = {lay.name: materialize(lay, hf) for lay in lays}
        want = expected_engine_tensors(spec, hf, delivery, etp, t)
        assert set(got) == set(want)
        for name in want:
            assert bytes_equal(got[name], want[name]), (name, t)
        per_rank.append(got)
        layouts.append(lays)
    back = to_hf(spec, layouts, per_rank)
    assert set(back) == set(hf)
    assert all(bytes_equal(back[n], hf[n]) for n in hf)


def test_inverse_refuses_disagreeing_replicas_and_dirty_padding():
    spec, etp = GQA8, 4  # KV heads replicated on pairs of ranks
    hf = random_hf(spec)
    layouts = [engine_layouts(spec, "inplace", etp, t) for t in range(etp)]
    tensors = [{lay.name: materialize(lay, hf) for lay in lays} for lays in layouts]
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    tensors[1][qkv][-1, 0] += 1.0  # rank 1's copy of the shared V head differs from rank 0's
    with pytest.raises(ValueError, match="differ between ranks"):
        to_hf(spec, layouts, tensors)
    tensors = [{lay.name: materialize(lay, hf) for lay in lays} for lays in layouts]
    tensors[3]["model.embed_tokens.weight"][-1, 0] = 1.0  # vocab 100 -> 128 rows: rank 3 ends in padding
    with pytest.raises(ValueError, match="padding"):
        to_hf(spec, layouts, tensors)


def test_engine_tp_constraints_are_named():
    with pytest.raises(ValueError, match="num_attention_heads"):
        check_engine_tp(QWEN2_TINY, 8)
    with pytest.raises(ValueError, match="num_query_groups"):
        check_engine_tp(replace(GQA8, num_query_groups=4, num_attention_heads=12, ffn_hidden_size=384), 3)
    with pytest.raises(ValueError, match="delivery"):
        engine_layouts(QWEN2_TINY, "disk", 1, 0)


def test_tied_engine_has_no_lm_head_and_untied_has_one():
    assert "lm_head.weight" not in {lay.name for lay in engine_layouts(LLAMA_TINY_TIED, "inplace", 2, 0)}
    assert "lm_head.weight" in {lay.name for lay in engine_layouts(QWEN2_TINY, "inplace", 2, 0)}
    assert "lm_head.weight" not in {lay.name for lay in engine_layouts(LLAMA_TINY_TIED, "loader", 2, 0)}


def test_bf16_layouts_are_byte_exact():
    spec = replace(QWEN2_TINY, params_dtype="bf16")
    hf = random_hf(spec, dtype=torch.bfloat16)
    for lay in engine_layouts(spec, "inplace", 2, 1):
        got = materialize(lay, hf)
        assert got.dtype == torch.bfloat16
        assert bytes_equal(got, expected_engine_tensors(spec, hf, "inplace", 2, 1)[lay.name])
