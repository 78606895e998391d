"""The HF mapping under both megatron naming schemes: the local layer spec (CPU) and
transformer-engine's fused norms (GPU), so it never depends on which spec built the model.

The TE names are not written here by hand: they come from megatron-core's own key map (the local
spec's `sharded_state_dict_keys_map`, which megatron's `apply_prefix_mapping` uses to make local
checkpoints load into TE models), applied to every local name the way megatron applies it.
"""

import pytest
import torch
from torch import nn

from megatron_rl.models.hf import (
    all_hf_names,
    canonical_name,
    fused_to_local_prefixes,
    hf_shape,
    hf_sources,
    hf_to_megatron_full,
    hf_to_megatron_shard,
    megatron_full_to_hf,
    megatron_names,
    shard_kind,
    split_layer_name,
    tp_unshard,
)
from megatron_rl.models.megatron import global_param_name
from tests.helpers.specs import SPECS


def _megatron_key_map() -> dict[str, str]:
    from megatron.core.models.gpt import gpt_layer_specs as S

    return S.get_gpt_layer_local_spec(normalization="RMSNorm").submodules.sharded_state_dict_keys_map


def _te_name(local: str, keys_map: dict[str, str]) -> str:
    """megatron's prefix mapping, applied inside a layer (the map's keys are layer-relative)."""
    layer, rest = split_layer_name(local)
    if layer is None:
        return local
    for old, new in keys_map.items():
        if rest.startswith(old):
            return f"decoder.layers.{layer}.{new}{rest[len(old) :]}"
    return local


@pytest.fixture(scope="module")
def keys_map():
    return _megatron_key_map()


def test_megatron_names_the_fused_norms(keys_map):
    # If megatron stopped stating the correspondence, the TE scheme would go untested: fail loudly.
    fused = set(keys_map.values())
    assert "self_attention.linear_qkv.layer_norm_" in fused
    assert "mlp.linear_fc1.layer_norm_" in fused
    assert fused_to_local_prefixes() == {v: k for k, v in keys_map.items()}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_every_te_name_maps_like_its_local_name(spec, keys_map):
    local_names = megatron_names(spec, range(spec.num_layers), True, True)
    te_names = [_te_name(n, keys_map) for n in local_names]
    renamed = [(a, b) for a, b in zip(local_names, te_names) if a != b]
    assert len(renamed) == 2 * spec.num_layers, "two fused norms per layer"
    assert all("layer_norm_weight" in te for _, te in renamed)

    g = torch.Generator().manual_seed(0)
    hf = {n: torch.randn(hf_shape(spec, n), generator=g) for n in all_hf_names(spec)}
    padded = spec.padded_vocab(2)
    for local, te in zip(local_names, te_names):
        assert canonical_name(te) == local
        assert canonical_name(local) == local
        assert hf_sources(spec, te) == hf_sources(spec, local)
        assert shard_kind(te) == shard_kind(local)
        full = hf_to_megatron_full(spec, te, hf, padded)
        assert torch.equal(full, hf_to_megatron_full(spec, local, hf, padded))
        back_te, back_local = megatron_full_to_hf(spec, te, full), megatron_full_to_hf(spec, local, full)
        assert back_te.keys() == back_local.keys()
        assert all(torch.equal(back_te[k], back_local[k]) for k in back_te)

        def read(n, dim, start, stop):
            t = hf[n]
            return t if dim is None else t.narrow(dim, start, stop - start)

        shards = [hf_to_megatron_shard(spec, te, read, 2, r, padded) for r in range(2)]
        assert torch.equal(tp_unshard(spec, te, shards), full)


def test_unknown_names_are_still_refused(keys_map):
    with pytest.raises(KeyError, match="unknown megatron tensor"):
        hf_sources(next(iter(SPECS.values())), "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias2")


class _Layer(nn.Module):
    """A TE-named layer as transformer-engine's spec lays it out (norm weights inside the linears)."""

    def __init__(self, layer_number: int):
        super().__init__()
        self.layer_number = layer_number
        self.self_attention = nn.Module()
        self.self_attention.linear_qkv = nn.Module()
        self.self_attention.linear_qkv.layer_norm_weight = nn.Parameter(torch.ones(4))
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = nn.Module()
        self.mlp.linear_fc1.layer_norm_weight = nn.Parameter(torch.ones(4))


def test_global_param_name_gives_local_names_for_a_te_stage():
    # A second PP stage (layers 2, 3): local index 0 is global layer 2.
    model = nn.Module()
    model.decoder = nn.Module()
    model.decoder.layers = nn.ModuleList([_Layer(3), _Layer(4)])
    names = sorted(global_param_name(model, n) for n, _ in model.named_parameters())
    assert names == [
        "decoder.layers.2.input_layernorm.weight",
        "decoder.layers.2.pre_mlp_layernorm.weight",
        "decoder.layers.3.input_layernorm.weight",
        "decoder.layers.3.pre_mlp_layernorm.weight",
    ]
