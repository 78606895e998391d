"""HF-named tensors grouped the way vLLM fuses them, so each in-place reload sees whole groups.

vLLM fuses q/k/v into `qkv_proj`, gate/up into `gate_up_proj`, and a mixture of experts' every
expert of a layer into one fused-MoE module (w13 = each expert's gate and up, w2 = its down). An in-place reload of part of a
fused group (say q_proj alone) is silently wrong on the CPU build: the packed kernel of the whole
group is rebuilt from what was loaded (probe q1b, case c4). So every reload call carries complete
groups, and a publication that splits a group is refused here, naming the missing members.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

_LAYER = re.compile(r"^(?P<prefix>.*\.layers\.\d+)\.(?P<leaf>.+)$")
_QKV = re.compile(r"^self_attn\.(?P<which>[qkv])_proj\.(?P<kind>weight|bias)$")
_GATE_UP = re.compile(r"^mlp\.(?P<which>gate|up)_proj\.weight$")
_EXPERT = re.compile(r"^mlp\.experts\.(?P<e>\d+)\.(?P<which>gate|up|down)_proj\.weight$")


def fused_group_key(hf_name: str) -> str:
    """The fused group a tensor belongs to: '<layer>.qkv', '<layer>.gate_up', or the name itself."""
    m = _LAYER.match(hf_name)
    if m:
        if _QKV.match(m["leaf"]):
            return m["prefix"] + ".qkv"
        if _GATE_UP.match(m["leaf"]):
            return m["prefix"] + ".gate_up"
        if _EXPERT.match(m["leaf"]):
            return m["prefix"] + ".mlp.experts"
    return hf_name


def _required(key: str, names: set[str], num_experts: int) -> set[str]:
    if key.endswith(".qkv"):
        prefix = key[: -len(".qkv")] + ".self_attn."
        need = {f"{prefix}{x}_proj.weight" for x in "qkv"}
        if any(n.endswith(".bias") for n in names):
            need |= {f"{prefix}{x}_proj.bias" for x in "qkv"}
        return need
    if key.endswith(".mlp.experts"):  # every expert of the layer, each with its three projections
        return {f"{key}.{e}.{x}_proj.weight" for e in range(num_experts) for x in ("gate", "up", "down")}
    if key.endswith(".gate_up"):
        prefix = key[: -len(".gate_up")] + ".mlp."
        return {prefix + "gate_proj.weight", prefix + "up_proj.weight"}
    return {key}


def group_fused(
    named_tensors: Iterable[tuple[str, torch.Tensor]], num_experts: int = 0
) -> list[list[tuple[str, torch.Tensor]]]:
    """Group (hf_name, tensor) pairs by fused group, in first-seen order; refuse split or duplicate groups.
    `num_experts`: the experts per layer of a mixture-of-experts model (each layer's group holds them all)."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    seen: set[str] = set()
    for name, tensor in named_tensors:
        if name in seen:
            raise ValueError(f"tensor {name!r} appears twice in one publication")
        seen.add(name)
        groups.setdefault(fused_group_key(name), []).append((name, tensor))
    for key, members in groups.items():
        names = {n for n, _ in members}
        if key.endswith(".mlp.experts") and num_experts < 1:
            raise ValueError(f"{key}: expert tensors published to an engine that holds no experts")
        missing = _required(key, names, num_experts) - names
        if missing:
            raise ValueError(
                f"fused group {key!r} is incomplete: missing {sorted(missing)}. vLLM rebuilds a fused kernel "
                "from what one reload call carries, so q/k/v (weights and biases) of a layer, gate/up, and "
                "every expert of a layer must be published together"
            )
    return list(groups.values())


_INDEXED = re.compile(r"^(?P<base>.+)\[(?P<index>\d+)\]$")


def indexed(name: str) -> tuple[str, int | None]:
    """'...experts.w13_weight[5]' -> ('...experts.w13_weight', 5): one expert's slice of a fused-MoE
    parameter (reshard/convert.py `_vllm_experts`); any other name -> (name, None)."""
    m = _INDEXED.match(name)
    return (m["base"], int(m["index"])) if m else (name, None)


def target_of(params: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The engine tensor a delivered name writes: a parameter, or one index of a fused-MoE parameter."""
    base, index = indexed(name)
    if base not in params:
        raise KeyError(f"the engine has no parameter {base!r} (in-place delivery uses vLLM names)")
    p = params[base]
    if index is None:
        return p
    if not 0 <= index < p.shape[0]:
        raise KeyError(f"{name}: index {index} is outside the engine's {p.shape[0]} experts")
    return p[index]


def covered(params: dict[str, torch.Tensor], incoming: Iterable[str]) -> set[str]:
    """The parameters a publication of `incoming` names writes whole: named plainly, or every index."""
    plain, parts = set(), {}
    for name in incoming:
        base, index = indexed(name)
        if index is None:
            plain.add(base)
        else:
            parts.setdefault(base, set()).add(index)
    whole = {b for b, idx in parts.items() if b in params and idx == set(range(params[b].shape[0]))}
    return (plain & set(params)) | whole
