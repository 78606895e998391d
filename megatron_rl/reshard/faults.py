"""Conversion faults, injected into chosen publications: what the checksums cannot see and the log-prob
agreement must (rollout/agreement.py, loop/placement/probe.py).

A publication's manifest is computed from what the trainer sends, so a fault made before the transfer --
which is where a conversion bug lives -- passes every checksum: the bytes arrive exactly as sent, and
they are another model. The faults, each on one layer (the last) of this rank's shards, in megatron-core's
layout (`Policy.named_parameters_global`):

    qkv_heads    two query heads of the first KV group swapped in linear_qkv (weight and bias)
    gate_up      the gate and up halves of linear_fc1 swapped (every expert's, for an MoE layer)
    stale_layer  the layer's tensors as they were at the first publication (a layer left behind)
    noise        linear_fc2 (every expert's) times 1 + 1e-3 x N(0, 1), the few-scrambled-values kind
    zero_proj    the attention output projection zeroed
    expert_swap  (MoE) experts 0 and 1 swapped (on the rank that holds both)
    expert_slice (MoE) expert 0's linear_fc1 rows rolled by a quarter (a wrong slice of the right tensor)

Chosen per publication version, e.g. MEGATRON_RL_PUBLICATION_FAULTS="qkv_heads@2,gate_up@3": for tests and
`benchmarks/agreement.py` only; a run with it set says so on its first lines. The parameters themselves are
never touched: a faulty tensor is a modified copy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator

import torch

ENV = "MEGATRON_RL_PUBLICATION_FAULTS"
DENSE = ("qkv_heads", "gate_up", "stale_layer", "noise", "zero_proj")
MOE = ("expert_swap", "expert_slice")
FAULTS = DENSE + MOE
NOISE = 1e-3
_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")

Named = Iterable[tuple[str, torch.Tensor]]


def parse(text: str) -> dict[int, str]:
    """ "name@version,..." -> {version: name}; refuses an unknown name or a version below 1."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, version = item.partition("@")
        if name not in FAULTS or not version.isdigit() or int(version) < 1:
            raise ValueError(
                f"{ENV}: {item!r} is not fault@version (faults: {', '.join(FAULTS)}; versions >= 1)"
            )
        out[int(version)] = name
    return out


class FaultInjector:
    """Applies the fault chosen for a version to the named shards a rank publishes. `spec`: the model's
    ModelSpec; `tp`: the trainer's tensor-parallel size (the shards' QKV groups)."""

    def __init__(self, plan: dict[int, str], spec, tp: int):
        self.plan, self.spec, self.tp = plan, spec, tp
        self.layer = spec.num_layers - 1
        self.first: dict[str, torch.Tensor] = {}  # the layer's tensors at the first publication (stale_layer)

    @classmethod
    def from_env(cls, spec, tp: int) -> FaultInjector | None:
        """The injector MEGATRON_RL_PUBLICATION_FAULTS asks for, or None when it is unset or empty."""
        text = os.environ.get(ENV, "")
        return cls(parse(text), spec, tp) if text.strip() else None

    def wrap(self, named: Callable[[], Named], version: Callable[[], int]) -> Callable[[], Named]:
        """`named` with the fault of the version being published (read when called) applied."""
        return lambda: self.apply(named(), version())

    def apply(self, named: Named, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        fault = self.plan.get(version)
        prefix = f"decoder.layers.{self.layer}."
        items = list(named)  # references: the faults swap tensors between names
        current = {n: t.detach() for n, t in items}
        for name, t in items:
            if name.startswith(prefix) and name not in self.first:
                self.first[name] = t.detach().clone()
        for name, t in items:
            if fault is None or not name.startswith(prefix):
                yield name, t
            else:
                yield name, self._fault(fault, name, current)

    def _fault(self, fault: str, name: str, current: dict[str, torch.Tensor]) -> torch.Tensor:
        t = current[name]
        expert = _EXPERT.search(name)
        if fault == "stale_layer":
            return self.first[name]
        if fault == "qkv_heads" and ".linear_qkv." in name:
            # Each shard holds whole KV groups, [q heads of the group; k; v] each: the first group's first
            # two blocks of head_dim rows are two query heads (or, one head per group, its query and key).
            hd, out = self.spec.head_dim, t.clone()
            out[:hd], out[hd : 2 * hd] = t[hd : 2 * hd], t[:hd]
            return out
        if fault == "gate_up" and ".linear_fc1.weight" in name:
            half = t.shape[0] // 2
            return torch.cat([t[half:], t[:half]])
        if fault == "noise" and ".linear_fc2.weight" in name:
            g = torch.Generator().manual_seed(0)
            noise = torch.randn(t.shape, generator=g, dtype=torch.float32, device="cpu")
            return t * (1 + NOISE * noise.to(device=t.device, dtype=t.dtype))
        if fault == "zero_proj" and ".linear_proj.weight" in name:
            return torch.zeros_like(t)
        if fault == "expert_swap" and expert and int(expert.group(1)) in (0, 1):
            j = int(expert.group(1))
            other = name.replace(f".local_experts.{j}.", f".local_experts.{1 - j}.")
            return current.get(other, t)
        if fault == "expert_slice" and expert and int(expert.group(1)) == 0 and ".linear_fc1." in name:
            return torch.roll(t, t.shape[0] // 4, dims=0)
        return t
