"""A mixture of experts on GPU with transformer-engine runs grouped expert GEMMs (megatron-core's
TEGroupedMLP), per-expert GEMMs on CPU (SequentialMLP): the config and layer-spec arguments that would be
built for each, and the grouped layout's weight names (`experts.linear_fc1.weight{i}`) mapped to the
per-expert names every consumer uses (HF import, publication, export: models/hf.py)."""

import torch
from torch import nn

from megatron_rl.models.hf import hf_sources, megatron_names
from megatron_rl.models.megatron import global_param_name, moe_spec_args, transformer_config
from megatron_rl.parallel.layout import ParallelLayout
from tests.helpers.specs import QWEN3_MOE_TINY as SPEC


def test_a_gpu_with_transformer_engine_builds_grouped_expert_gemms():
    layout = ParallelLayout(tp=1, ep=1, dp=1)
    te = transformer_config(SPEC, layout, "bf16", on_cpu=False, use_te=True)
    assert te.moe_grouped_gemm is True and te.moe_token_dispatcher_type == "alltoall"
    assert moe_spec_args(SPEC, use_te=True) == {"num_experts": SPEC.num_experts, "moe_grouped_gemm": True}
    # The local spec (CPU, or a GPU without TE): one GEMM per expert.
    assert transformer_config(SPEC, layout, "fp32").moe_grouped_gemm is False
    assert transformer_config(SPEC, layout, "bf16", on_cpu=False, use_te=False).moe_grouped_gemm is False
    assert moe_spec_args(SPEC, use_te=False)["moe_grouped_gemm"] is False


class _GroupedLayer(nn.Module):
    """A layer's experts as TEGroupedMLP lays them out on an EP rank holding global experts 2 and 3."""

    def __init__(self, layer_number: int):
        super().__init__()
        self.layer_number = layer_number
        self.mlp = nn.Module()
        self.mlp.local_expert_indices = [2, 3]
        self.mlp.experts = nn.Module()
        for fc in ("linear_fc1", "linear_fc2"):
            setattr(self.mlp.experts, fc, nn.Module())
            for i in range(2):
                setattr(getattr(self.mlp.experts, fc), f"weight{i}", nn.Parameter(torch.zeros(1)))


def test_grouped_expert_weights_take_the_per_expert_names():
    model = nn.Module()
    model.decoder = nn.Module()
    model.decoder.layers = nn.ModuleList([_GroupedLayer(2)])  # a second PP stage: global layer 1
    names = sorted(global_param_name(model, n) for n, _ in model.named_parameters())
    want = sorted(n for n in megatron_names(SPEC, range(1, 2), False, False, range(2, 4)) if ".experts." in n)
    assert (
        names
        == want
        == [
            "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight",
            "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight",
            "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight",
            "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight",
        ]
    )
    assert hf_sources(SPEC, names[0]) == [
        "model.layers.1.mlp.experts.2.gate_proj.weight",
        "model.layers.1.mlp.experts.2.up_proj.weight",
    ]
