"""Megatron shards and engine tensors described in one coordinate system: runs of HF rows.

Every tensor the reshard touches -- a trainer rank's megatron shard, an engine rank's vLLM
parameter, a whole HF tensor for the loader -- is a concatenation, along one dim, of runs of rows
(columns for `o_proj` / `down_proj`) of HF checkpoint tensors, plus zero padding. Written that way,
"which trainer rank holds the bytes this engine rank needs" is an interval intersection (plan.py),
and the fused layouts of both sides (megatron's per-group QKV interleave and `[gate_r; up_r]`,
vLLM's per-rank `[q_r; k_r; v_r]` and `[gate_r; up_r]`, both vocab paddings) are just orders of
runs. The layouts here restate hf.py's sharding rules; a unit test checks them against
`hf_to_megatron_shard` and an independent slicing of vLLM's loader rules.

Deliveries:
- `inplace`: each engine rank receives its own vLLM parameters (vLLM names, vLLM's TP split, KV
  heads replicated when engine TP > KV heads, vocabulary padded to 64 rows then split) and can
  write them straight into its parameters (GPU; vLLM's parameters are plain there).
- `loader`: each engine rank receives whole HF tensors, handed to vLLM's `reload_weights`
  grouped by fused group (`rollout.weights.group_fused`); vLLM slices its own TP part. What the
  CPU build accepts; every engine rank receives the whole model.

Legend: `Segment(hf, start, length)` = rows [start, start+length) of HF tensor `hf` along the
tensor's `dim`; `hf=None` = `length` rows of zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from megatron_rl.models.hf import all_hf_names, hf_shape, hf_sources, shard_kind
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.rules import ENGINE_VOCAB_PAD, engine_problems

DELIVERIES = ("inplace", "loader")
# vLLM's DEFAULT_VOCAB_PADDING_SIZE: vocab rows padded to this, then split over TP (the layout rules' copy).
VLLM_VOCAB_PAD = ENGINE_VOCAB_PAD
# Where vLLM's fused-MoE weights sit in a layer's `mlp` (read off the engine's named_parameters()).
VLLM_EXPERTS = "experts.routed_experts."


@dataclass(frozen=True)
class Segment:
    hf: str | None  # None = zero padding
    start: int
    length: int


@dataclass(frozen=True)
class TensorLayout:
    """A tensor as runs of HF rows along `dim` (0, or 1 for row-parallel weights)."""

    name: str
    shape: tuple[int, ...]
    dim: int
    segments: tuple[Segment, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def unit(self) -> int:
        """Elements in one row (one column when dim == 1) of this tensor."""
        return self.numel // self.shape[self.dim] if self.shape[self.dim] else 0


def hf_split_dim(hf_name: str) -> int:
    """The dim along which TP splits an HF tensor: columns for o_proj / down_proj, rows otherwise."""
    return 1 if hf_name.endswith(("o_proj.weight", "down_proj.weight")) else 0


def _layout(spec: ModelSpec, name: str, ref_hf: str, dim: int, segs: list[Segment]) -> TensorLayout:
    shape = list(hf_shape(spec, ref_hf))
    shape[dim] = sum(s.length for s in segs)
    return TensorLayout(name, tuple(shape), dim, tuple(segs))


def _vocab_segments(hf: str, start: int, rows: int, vocab: int) -> list[Segment]:
    real = max(0, min(start + rows, vocab) - start)
    segs = [Segment(hf, start, real)] if real else []
    if rows > real:
        segs.append(Segment(None, 0, rows - real))
    return segs


# ---- trainer side ----------------------------------------------------------------------------


def megatron_layout(spec: ModelSpec, name: str, tp: int, rank: int, padded_vocab: int) -> TensorLayout:
    """The TP rank's shard of a global megatron tensor (same rules as hf.hf_to_megatron_shard)."""
    kind, srcs = shard_kind(name), hf_sources(spec, name)
    if kind == "vocab":
        rows = padded_vocab // tp
        return _layout(spec, name, srcs[0], 0, _vocab_segments(srcs[0], rank * rows, rows, spec.vocab_size))
    if kind == "qkv":
        per, q_rows, hd = spec.num_query_groups // tp, spec.heads_per_group * spec.head_dim, spec.head_dim
        segs = []
        for g in range(rank * per, (rank + 1) * per):
            segs += [
                Segment(srcs[0], g * q_rows, q_rows),
                Segment(srcs[1], g * hd, hd),
                Segment(srcs[2], g * hd, hd),
            ]
        return _layout(spec, name, srcs[0], 0, segs)
    if kind == "fc1":
        f = hf_shape(spec, srcs[0])[0] // tp
        return _layout(spec, name, srcs[0], 0, [Segment(s, rank * f, f) for s in srcs])
    if kind == "row":
        cols = hf_shape(spec, srcs[0])[1] // tp
        return _layout(spec, name, srcs[0], 1, [Segment(srcs[0], rank * cols, cols)])
    return _layout(spec, name, srcs[0], 0, [Segment(srcs[0], 0, hf_shape(spec, srcs[0])[0])])


# ---- engine side -----------------------------------------------------------------------------


def engine_vocab_rows(spec: ModelSpec, engine_tp: int) -> int:
    """Rows of vLLM's vocab-parallel embedding / lm_head on one engine rank (padding included)."""
    padded = -(-spec.vocab_size // VLLM_VOCAB_PAD) * VLLM_VOCAB_PAD
    return padded // engine_tp


def check_engine_tp(spec: ModelSpec, engine_tp: int, engine_ep: bool = False) -> None:
    """Refuse an engine TP that vLLM cannot shard this model at (the layout's own rule), naming it."""
    problems = engine_problems(engine_tp, spec, engine_ep)
    if problems:
        raise ValueError(f"{problems[0]}; pick another engine_tp")


def _vllm_layer_layouts(
    spec: ModelSpec, i: int, etp: int, t: int, engine_ep: bool = False
) -> list[TensorLayout]:
    # vLLM's parameter names and HF's share the layer prefix.
    h = p = f"model.layers.{i}."
    hd = spec.head_dim
    q_l = spec.num_attention_heads // etp * hd
    kv_heads = max(1, spec.num_query_groups // etp)  # per rank; 1 replicated head when etp > groups
    kv_src = t // max(1, etp // spec.num_query_groups)  # vLLM: tp_rank // num_kv_head_replicas

    def qkv(kind: str) -> list[Segment]:
        q, k, v = (f"{h}self_attn.{x}_proj.{kind}" for x in "qkv")
        kv = kv_heads * hd
        return [Segment(q, t * q_l, q_l), Segment(k, kv_src * kv, kv), Segment(v, kv_src * kv, kv)]

    def whole(name: str, hf: str) -> TensorLayout:
        return _layout(spec, name, hf, 0, [Segment(hf, 0, hf_shape(spec, hf)[0])])

    out = [
        whole(p + "input_layernorm.weight", h + "input_layernorm.weight"),
        _layout(spec, p + "self_attn.qkv_proj.weight", h + "self_attn.q_proj.weight", 0, qkv("weight")),
    ]
    if spec.qkv_bias:
        out.append(_layout(spec, p + "self_attn.qkv_proj.bias", h + "self_attn.q_proj.bias", 0, qkv("bias")))
    if spec.qk_norm:
        out += [whole(p + f"self_attn.{x}_norm.weight", h + f"self_attn.{x}_norm.weight") for x in "qk"]
    o = h + "self_attn.o_proj.weight"
    out += [
        _layout(spec, p + "self_attn.o_proj.weight", o, 1, [Segment(o, t * q_l, q_l)]),
        whole(p + "post_attention_layernorm.weight", h + "post_attention_layernorm.weight"),
    ]
    return out + (_vllm_experts(spec, i, etp, t, engine_ep) if spec.is_moe else _vllm_mlp(spec, i, etp, t))


def _vllm_mlp(spec: ModelSpec, i: int, etp: int, t: int) -> list[TensorLayout]:
    h = f"model.layers.{i}."
    f_l = spec.ffn_hidden_size // etp
    down, gate, up = h + "mlp.down_proj.weight", h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"
    return [
        _layout(
            spec,
            h + "mlp.gate_up_proj.weight",
            gate,
            0,
            [Segment(gate, t * f_l, f_l), Segment(up, t * f_l, f_l)],
        ),
        _layout(spec, h + "mlp.down_proj.weight", down, 1, [Segment(down, t * f_l, f_l)]),
    ]


def _vllm_experts(spec: ModelSpec, i: int, etp: int, t: int, engine_ep: bool = False) -> list[TensorLayout]:
    """vLLM's fused MoE at engine TP: a replicated router `mlp.gate`, and per layer
    `experts.routed_experts.w13_weight` [E, 2I/tp, H] (each expert's [gate_r; up_r]) and
    `...w2_weight` [E, H, I/tp] (the names vLLM 0.32's Qwen3-MoE holds: its FusedMoE is a runner whose
    weights sit in a `routed_experts` module). Each expert's slice is one tensor here, named
    `w13_weight[e]` (rollout/weights.py `indexed`), so every layout stays runs of HF rows along one dim.

    With `engine_ep` (vLLM's `enable_expert_parallel`, its linear placement), engine rank t holds experts
    t*E/tp .. (t+1)*E/tp - 1 whole, as local indices 0..E/tp - 1."""
    h = f"model.layers.{i}.mlp."
    per = spec.num_experts // etp if engine_ep else spec.num_experts
    first = t * per if engine_ep else 0
    f = spec.moe_ffn_hidden_size if engine_ep else spec.moe_ffn_hidden_size // etp
    start = 0 if engine_ep else t * f
    router = h + "gate.weight"
    out = [_layout(spec, router, router, 0, [Segment(router, 0, spec.num_experts)])]
    for local in range(per):
        gate, up, down = (f"{h}experts.{first + local}.{x}_proj.weight" for x in ("gate", "up", "down"))
        out += [
            _layout(spec, f"{h}{VLLM_EXPERTS}w13_weight[{local}]", gate, 0, [Segment(gate, start, f), Segment(up, start, f)]),
            _layout(spec, f"{h}{VLLM_EXPERTS}w2_weight[{local}]", down, 1, [Segment(down, start, f)]),
        ]  # fmt: skip
    return out


def engine_layouts(
    spec: ModelSpec, delivery: str, engine_tp: int, rank: int, engine_ep: bool = False
) -> list[TensorLayout]:
    """The tensors one engine rank receives, in delivery order (same names on every engine rank)."""
    if delivery == "loader":
        out = []
        for hf in all_hf_names(spec):
            shape, dim = hf_shape(spec, hf), hf_split_dim(hf)
            out.append(TensorLayout(hf, shape, dim, (Segment(hf, 0, shape[dim]),)))
        return out
    if delivery != "inplace":
        raise ValueError(f"reshard delivery {delivery!r} is not one of {DELIVERIES}")
    check_engine_tp(spec, engine_tp, engine_ep)
    rows = engine_vocab_rows(spec, engine_tp)
    emb = "model.embed_tokens.weight"
    out = [_layout(spec, emb, emb, 0, _vocab_segments(emb, rank * rows, rows, spec.vocab_size))]
    for i in range(spec.num_layers):
        out += _vllm_layer_layouts(spec, i, engine_tp, rank, engine_ep)
    out.append(
        _layout(
            spec,
            "model.norm.weight",
            "model.norm.weight",
            0,
            [Segment("model.norm.weight", 0, spec.hidden_size)],
        )
    )
    if not spec.tie_word_embeddings:  # tied: vLLM's lm_head *is* embed_tokens
        out.append(
            _layout(
                spec,
                "lm_head.weight",
                "lm_head.weight",
                0,
                _vocab_segments("lm_head.weight", rank * rows, rows, spec.vocab_size),
            )
        )
    return out


# ---- materialising layouts (single process: tests, the inverse) ------------------------------


def region(t: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
    return t.narrow(dim, start, length)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor (a view when contiguous, else a copy)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-for-byte equality (float `==` would equate -0.0 with 0.0 and fail on NaN)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def materialize(layout: TensorLayout, hf: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Build a tensor of this layout from whole HF tensors (zeros for padding)."""
    ref = next((hf[s.hf] for s in layout.segments if s.hf is not None), None)
    dtype = ref.dtype if ref is not None else torch.float32
    out = torch.zeros(layout.shape, dtype=dtype)
    off = 0
    for s in layout.segments:
        if s.hf is not None:
            region(out, layout.dim, off, s.length).copy_(region(hf[s.hf], layout.dim, s.start, s.length))
        off += s.length
    return out


def to_hf(
    spec: ModelSpec,
    layouts_by_rank: list[list[TensorLayout]],
    tensors_by_rank: list[Mapping[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """Inverse: whole HF tensors from the tensors of every rank of one engine (or trainer stage set).

    Every HF row must be covered, and rows held by several ranks (replicated norms, KV heads
    replicated by vLLM) must agree byte for byte; padding must be zero.
    """
    out: dict[str, torch.Tensor] = {}
    filled: dict[str, torch.Tensor] = {}
    for layouts, tensors in zip(layouts_by_rank, tensors_by_rank):
        for lay in layouts:
            t, off = tensors[lay.name], 0
            for s in lay.segments:
                part = region(t, lay.dim, off, s.length)
                off += s.length
                if s.hf is None:
                    if torch.any(as_bytes(part) != 0):
                        raise ValueError(f"{lay.name}: padding rows are not zero")
                    continue
                if s.hf not in out:
                    out[s.hf] = torch.empty(hf_shape(spec, s.hf), dtype=t.dtype)
                    filled[s.hf] = torch.zeros(hf_shape(spec, s.hf)[lay.dim], dtype=torch.bool)
                dst, seen = (
                    region(out[s.hf], lay.dim, s.start, s.length),
                    filled[s.hf][s.start : s.start + s.length],
                )
                if seen.any() and not bytes_equal(dst, part):
                    raise ValueError(f"{s.hf}: rows {s.start}..{s.start + s.length} differ between ranks")
                dst.copy_(part)
                seen.fill_(True)
    for name, seen in filled.items():
        if not bool(seen.all()):
            raise ValueError(f"{name}: rows {torch.nonzero(~seen)[0].item()}.. are held by no rank")
    return out
