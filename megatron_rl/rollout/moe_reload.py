"""vLLM's CPU build after a weight reload of a mixture of experts: repack the experts it left raw.

The CPU fused-MoE kernel keeps each layer's `w13_weight` / `w2_weight` in a prepacked grouped-GEMM
layout, made by its experts' `process_weights_after_loading` (vLLM 0.32:
`experts/cpu_moe.py CPUUnquantizedExperts`). On a reload, `UnquantizedFusedMoEMethod._setup_kernel`
sees its kernel already built (`is_weight_update`) and skips that call, so the reloaded experts stay in
the checkpoint's row order while the kernel reads them as packed: measured here, the engine's log-probs
then differ from transformers' by up to 0.12 nats (4.8e-7 when the same weights are loaded at start).

So after each layer's reload the engine compares the layer's weights with the raw stack of what it just
sent: equal means vLLM left them raw, and the experts' own packing is applied; anything else means vLLM
processed them itself (a later vLLM that fixes this), and nothing is done. GPU engines receive their
experts in place, in the Triton kernel's own layout, and never come here.
"""

from __future__ import annotations

import re

import torch

_EXPERT = re.compile(r"^(?P<layer>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<which>gate|up|down)_proj\.weight$")
# Where vLLM keeps a layer's fused experts, under the HF prefix `...mlp.experts` (reshard/convert.py).
ROUTED = "routed_experts"


def raw_stacks(group: list[tuple[str, torch.Tensor]]) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(the layer's `...mlp.experts` prefix, w13 [E, 2I, H] = each expert's [gate; up], w2 [E, H, I])
    from one layer's published expert tensors, as vLLM's loader lays them out unpacked."""
    by: dict[tuple[int, str], torch.Tensor] = {}
    layer = None
    for name, t in group:
        m = _EXPERT.match(name)
        if m is None:
            raise ValueError(f"{name!r} is not an expert tensor")
        layer = m["layer"]
        by[(int(m["e"]), m["which"])] = t
    experts = range(max(e for e, _ in by) + 1)
    w13 = torch.stack([torch.cat([by[(e, "gate")], by[(e, "up")]]) for e in experts])
    w2 = torch.stack([by[(e, "down")] for e in experts])
    return layer, w13, w2


def repack_if_left_raw(model: torch.nn.Module, group: list[tuple[str, torch.Tensor]]) -> bool:
    """After reloading one layer's experts on the CPU build: apply the CPU kernel's packing when vLLM left
    the weights raw. Returns whether it packed."""
    layer, w13, w2 = raw_stacks(group)
    experts = model.get_submodule(f"{layer}.{ROUTED}")
    held13, held2 = experts.w13_weight.detach(), experts.w2_weight.detach()
    if held13.shape != w13.shape or held2.shape != w2.shape:
        raise RuntimeError(
            f"{layer}: the engine holds experts of shape {list(held13.shape)} / {list(held2.shape)} after the "
            f"reload, not the published {list(w13.shape)} / {list(w2.shape)}: the CPU kernel pads them, and "
            "whether vLLM repacked them cannot be told; this model's FFN width is not supported on CPU"
        )
    if not (torch.equal(held13, w13.to(held13.dtype)) and torch.equal(held2, w2.to(held2.dtype))):
        return False  # vLLM processed the reload itself
    experts.quant_method.moe_kernel.fused_experts.process_weights_after_loading(experts)
    return True
