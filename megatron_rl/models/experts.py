"""How the trainer runs a mixture of experts' GEMMs, in one place for the model build and the planner.

- `grouped`: transformer-engine's layer spec with `moe_grouped_gemm=True` builds megatron-core's
  `TEGroupedMLP`, whose `TEColumnParallelGroupedLinear` / `TERowParallelGroupedLinear` run every local
  expert's GEMM in one call (TE's GroupedLinear). Its weights are `experts.linear_fc1.weight{i}` and
  `experts.linear_fc2.weight{i}`, i the local expert, each shaped as one expert's linear at the expert
  TP (fc1 `[gate_r; up_r]`, as the per-expert layout): only the names differ.
- `per_expert`: megatron-core's `SequentialMLP`, one small MLP per local expert driven from Python
  (`experts.local_experts.{i}.linear_fc1.weight`): the local layer spec (CPU), or a GPU without TE
  (the local spec's grouped GEMM is the legacy `GroupedMLP`, which needs the `grouped_gemm` package).

The planner charges per-expert GEMMs their launch-bound overhead (plan/cycle.py), so its MoE time follows
what runs. No torch here: the planner imports this.
"""

from __future__ import annotations

GROUPED, PER_EXPERT = "grouped", "per_expert"
_GROUPED_LINEARS = ("linear_fc1", "linear_fc2")


def expert_gemm(use_te: bool) -> str:
    """`grouped` with transformer-engine's layer spec, `per_expert` with the local one."""
    return GROUPED if use_te else PER_EXPERT


def grouped_to_per_expert(parts: list[str]) -> list[str]:
    """The name parts of a grouped expert weight (`... mlp.experts.linear_fc1.weight3`) in the per-expert
    layout (`... mlp.experts.local_experts.3.linear_fc1.weight`), local index kept; other names as given.
    `parts` starts at the layer: ['decoder', 'layers', L, 'mlp', 'experts', ...]."""
    if parts[3:5] != ["mlp", "experts"] or len(parts) != 7 or parts[5] not in _GROUPED_LINEARS:
        return parts
    leaf = parts[6]
    for kind in ("weight", "bias"):
        index = leaf[len(kind) :]
        if leaf.startswith(kind) and index.isdigit():
            return [*parts[:5], "local_experts", index, parts[5], kind]
    return parts
