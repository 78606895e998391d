"""Megatron <-> HF names and fused layouts, at full size and per TP shard.

Megatron-core fuses tensors that HF keeps apart, and shards them across TP in ways that are not a
plain chunk of the fused tensor (DESIGN.md section 4, verified numerically):

- `linear_qkv` (GQA) is grouped per KV group g: `[q rows of g's heads; k_g; v_g]`, and a TP rank
  holds a contiguous run of whole groups. Plain `[Wq; Wk; Wv]` stacking is wrong.
- `linear_fc1` (SwiGLU) is `[gate; up]` in full, and each TP shard is `[gate_r; up_r]`.
- `linear_proj`, `linear_fc2` split on dim 1; embeddings and the output layer split vocab rows,
  which megatron pads to a multiple of `make_vocab_size_divisible_by x TP`.

Names here are *global* megatron names (layer index counted over the whole model, not the PP
stage's local index). The same functions serve checkpoint import, export and the reshard oracle.

Two naming schemes, one mapping: the local layer spec (CPU, no transformer-engine) keeps the norms
apart (`input_layernorm.weight`, `pre_mlp_layernorm.weight`), while the transformer-engine spec
fuses them into the following linear (`self_attention.linear_qkv.layer_norm_weight`,
`mlp.linear_fc1.layer_norm_weight`). Every function here accepts both; `canonical_name` maps a
fused name to the local one using megatron-core's own statement of the correspondence (the local
spec's `sharded_state_dict_keys_map`, models/megatron.py), and the names this module produces are
the local ones.

Mixture of experts (Qwen3-MoE): each layer's MLP is a router (`mlp.router.weight` <- HF `mlp.gate`)
and experts `mlp.experts.local_experts.{e}.linear_fc1/fc2` <- HF `mlp.experts.{e}.gate_proj/up_proj/
down_proj`, sharded like the dense MLP but over the *expert* TP (ETP), and held whole by the EP rank
that owns expert e. Names here count experts globally (0..E-1); a model's parameters count them per
EP rank, mapped by `models/megatron.py global_param_name`.

A value model (PPO's critic, a learned reward model) has a scalar head instead of the vocabulary's output
layer: its `output_layer.weight` is [1, h], replicated over TP, from HF `score.weight` of a
`*ForSequenceClassification` checkpoint with one label. The mapping names it VALUE_HEAD (`value_head=True`
below), so no function here mistakes it for the vocabulary's rows.

Legend: rows are dim 0 of a weight; `R` = row range; `hd` = head_dim; `G` = KV groups.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from megatron_rl.models.spec import ModelSpec

# A reader of HF tensors: (hf_name, dim, start, stop) -> the slice [start:stop) along dim,
# or the whole tensor when dim is None. Lets each rank read only the rows it owns.
HFReader = Callable[[str, int | None, int, int], torch.Tensor]

LAYER_PREFIX = "decoder.layers."
VALUE_HEAD = (
    "output_layer.value_head.weight"  # a value model's `output_layer.weight`, as the mapping names it
)
SCORE = "score.weight"  # its HF name in a *ForSequenceClassification checkpoint
EXPERT_PREFIX = "mlp.experts.local_experts."


def megatron_names(
    spec: ModelSpec,
    layers: range,
    pre_process: bool,
    post_process: bool,
    experts: range | None = None,
    value_head: bool = False,
) -> list[str]:
    """Global megatron parameter names held by a PP stage with these layers (and, for an MoE model, these
    global expert indices: one EP rank's share; every expert when None). `value_head`: a value model's,
    whose last stage holds the scalar head instead of the output layer."""
    names: list[str] = []
    experts = range(spec.num_experts) if experts is None else experts
    if pre_process:
        names.append("embedding.word_embeddings.weight")
    for i in layers:
        p = f"{LAYER_PREFIX}{i}."
        names += [p + "input_layernorm.weight", p + "self_attention.linear_qkv.weight"]
        if spec.qkv_bias:
            names.append(p + "self_attention.linear_qkv.bias")
        if spec.qk_norm:
            names += [p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight"]
        names += [p + "self_attention.linear_proj.weight", p + "pre_mlp_layernorm.weight"]
        if spec.is_moe:
            names.append(p + "mlp.router.weight")
            for e in experts:
                names += [
                    f"{p}{EXPERT_PREFIX}{e}.linear_fc1.weight",
                    f"{p}{EXPERT_PREFIX}{e}.linear_fc2.weight",
                ]
        else:
            names += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    if post_process and value_head:
        names += ["decoder.final_layernorm.weight", VALUE_HEAD]
    elif post_process:
        names.append("decoder.final_layernorm.weight")
        # Tied embeddings: the last stage keeps its own copy of the embedding only when it is not
        # also the first stage (megatron syncs the two copies through the embedding group).
        if not spec.tie_word_embeddings or not pre_process:
            names.append("output_layer.weight")
    return names


def fused_to_local_prefixes() -> dict[str, str]:
    """transformer-engine's fused-norm name prefixes -> the local spec's, within a layer.

    Read from megatron-core itself: the local spec's `sharded_state_dict_keys_map` is how megatron
    keeps local-spec checkpoints loadable by TE models ({'input_layernorm.':
    'self_attention.linear_qkv.layer_norm_', ...}); inverted, it names every parameter the TE spec
    fuses. The local spec imports without transformer-engine, so this works on any machine."""
    from megatron.core.models.gpt import gpt_layer_specs as S

    keys_map = S.get_gpt_layer_local_spec(normalization="RMSNorm").submodules.sharded_state_dict_keys_map
    return {fused: local for local, fused in keys_map.items()}


def canonical_name(name: str) -> str:
    """The local-spec name of a megatron tensor named in either scheme (TE's fused norms mapped back)."""
    if "layer_norm_" not in name:  # the only names the two schemes disagree on
        return name
    layer, rest = _split(name)
    for fused, local in fused_to_local_prefixes().items():
        if rest.startswith(fused):
            rest = local + rest[len(fused) :]
            break
    return rest if layer is None else f"{LAYER_PREFIX}{layer}.{rest}"


def _split(name: str) -> tuple[int | None, str]:
    if name.startswith(LAYER_PREFIX):
        idx, rest = name[len(LAYER_PREFIX) :].split(".", 1)
        return int(idx), rest
    return None, name


def expert_of(name: str) -> int | None:
    """The global expert index of an expert tensor's name; None for every other tensor."""
    _, rest = _split(name)
    if not rest.startswith(EXPERT_PREFIX):
        return None
    return int(rest[len(EXPERT_PREFIX) :].split(".", 1)[0])


def split_layer_name(name: str) -> tuple[int | None, str]:
    """'decoder.layers.3.mlp.linear_fc1.weight' -> (3, 'mlp.linear_fc1.weight'); either naming scheme."""
    return _split(canonical_name(name))


_SIMPLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def hf_sources(spec: ModelSpec, name: str) -> list[str]:
    """The HF tensors one megatron tensor is built from (in fused order)."""
    layer, rest = split_layer_name(name)
    if layer is None:
        if name == "embedding.word_embeddings.weight":
            return ["model.embed_tokens.weight"]
        if name == "output_layer.weight":
            return ["model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"]
        if name == "decoder.final_layernorm.weight":
            return ["model.norm.weight"]
        if name == VALUE_HEAD:
            return [SCORE]
        raise KeyError(f"unknown megatron tensor {name!r}")
    p = f"model.layers.{layer}."
    if rest.startswith(EXPERT_PREFIX):
        e, leaf = rest[len(EXPERT_PREFIX) :].split(".", 1)
        if leaf == "linear_fc1.weight":
            return [p + f"mlp.experts.{e}.gate_proj.weight", p + f"mlp.experts.{e}.up_proj.weight"]
        if leaf == "linear_fc2.weight":
            return [p + f"mlp.experts.{e}.down_proj.weight"]
        raise KeyError(f"unknown megatron tensor {name!r}")
    if rest == "mlp.router.weight":
        return [p + "mlp.gate.weight"]
    if rest in _SIMPLE:
        return [p + _SIMPLE[rest]]
    if rest == "self_attention.linear_qkv.weight":
        return [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
    if rest == "self_attention.linear_qkv.bias":
        return [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
    if rest == "mlp.linear_fc1.weight":
        return [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
    raise KeyError(f"unknown megatron tensor {name!r}")


def hf_shape(spec: ModelSpec, hf_name: str) -> tuple[int, ...]:
    """The shape HF's checkpoint must hold for this tensor (used to refuse malformed checkpoints)."""
    h, f, hd = spec.hidden_size, spec.ffn_hidden_size, spec.head_dim
    if hf_name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (spec.vocab_size, h)
    if hf_name == "model.norm.weight" or hf_name.endswith("layernorm.weight"):
        return (h,)
    if hf_name == SCORE:
        return (1, h)
    leaf = hf_name.split(".", 3)[-1]
    if leaf.startswith("mlp.experts."):  # mlp.experts.{e}.gate_proj.weight
        e, leaf = leaf[len("mlp.experts.") :].split(".", 1)
        fe = spec.moe_ffn_hidden_size
        shape = {"gate_proj.weight": (fe, h), "up_proj.weight": (fe, h), "down_proj.weight": (h, fe)}.get(
            leaf
        )
        if shape is None or not e.isdigit() or int(e) >= spec.num_experts:
            raise KeyError(f"unknown HF tensor {hf_name!r}")
        return shape
    if leaf == "mlp.gate.weight" and spec.is_moe:
        return (spec.num_experts, h)
    shapes = {
        "self_attn.q_proj.weight": (spec.q_size, h),
        "self_attn.k_proj.weight": (spec.kv_size, h),
        "self_attn.v_proj.weight": (spec.kv_size, h),
        "self_attn.q_proj.bias": (spec.q_size,),
        "self_attn.k_proj.bias": (spec.kv_size,),
        "self_attn.v_proj.bias": (spec.kv_size,),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "self_attn.o_proj.weight": (h, spec.q_size),
        "mlp.gate_proj.weight": (f, h),
        "mlp.up_proj.weight": (f, h),
        "mlp.down_proj.weight": (h, f),
    }
    if leaf not in shapes:
        raise KeyError(f"unknown HF tensor {hf_name!r}")
    return shapes[leaf]


def all_hf_names(spec: ModelSpec, value_head: bool = False) -> list[str]:
    """Every tensor an HF checkpoint of this spec must hold (`value_head`: a sequence-classification one)."""
    names = megatron_names(spec, range(spec.num_layers), True, True, value_head=value_head)
    return list(dict.fromkeys(s for n in names for s in hf_sources(spec, n)))


# ---- TP sharding of megatron tensors ---------------------------------------------------------


def shard_kind(name: str) -> str:
    """How a megatron tensor is split across TP: 'vocab', 'qkv', 'fc1', 'row' (dim 1) or 'replicated'.
    An expert's fc1 / fc2 split the same way over the expert TP (`tp_of`)."""
    _, rest = split_layer_name(name)
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return "vocab"
    if rest.startswith("self_attention.linear_qkv."):
        return "qkv"
    if rest.endswith("linear_fc1.weight"):
        return "fc1"
    if rest == "self_attention.linear_proj.weight" or rest.endswith("linear_fc2.weight"):
        return "row"
    return "replicated"


def tp_of(name: str, tp: int, etp: int) -> int:
    """The TP degree a tensor is split over: the expert TP for an expert's weights, the TP otherwise."""
    return etp if expert_of(name) is not None else tp


def tp_shard(spec: ModelSpec, name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """The TP rank's shard of a full (unsharded, vocab already padded) megatron tensor."""
    kind = shard_kind(name)
    if kind in ("vocab", "qkv"):  # qkv: groups are contiguous, so whole groups = a dim-0 chunk
        return full.chunk(tp, 0)[rank]
    if kind == "fc1":
        gate, up = full.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]], 0)
    if kind == "row":
        return full.chunk(tp, 1)[rank]
    return full


def tp_unshard(spec: ModelSpec, name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of `tp_shard`: the full megatron tensor from every TP rank's shard, in rank order."""
    kind = shard_kind(name)
    if kind in ("vocab", "qkv"):
        return torch.cat(shards, 0)
    if kind == "fc1":
        halves = [s.chunk(2, 0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    if kind == "row":
        return torch.cat(shards, 1)
    return shards[0]


# ---- full-size conversion --------------------------------------------------------------------


def _qkv_group_rows(spec: ModelSpec, g: int) -> tuple[range, range]:
    """Rows of group g in HF's q and in HF's k/v tensors."""
    q_rows = spec.heads_per_group * spec.head_dim
    return range(g * q_rows, (g + 1) * q_rows), range(g * spec.head_dim, (g + 1) * spec.head_dim)


def hf_to_megatron_shard(
    spec: ModelSpec, name: str, read: HFReader, tp: int, rank: int, padded_vocab: int
) -> torch.Tensor:
    """Build one TP shard of a megatron tensor, reading only the HF rows/columns the shard needs."""
    kind = shard_kind(name)
    srcs = hf_sources(spec, name)
    if kind == "vocab":
        rows = padded_vocab // tp
        start, stop = rank * rows, (rank + 1) * rows
        real_stop = min(stop, spec.vocab_size)
        part = read(srcs[0], 0, start, real_stop) if real_stop > start else None
        out = torch.zeros(rows, spec.hidden_size, dtype=part.dtype if part is not None else torch.float32)
        if part is not None:
            out[: real_stop - start] = part
        return out
    if kind == "qkv":
        groups = spec.num_query_groups // tp
        pieces = []
        for g in range(rank * groups, (rank + 1) * groups):
            q_r, kv_r = _qkv_group_rows(spec, g)
            pieces.append(read(srcs[0], 0, q_r.start, q_r.stop))
            pieces.append(read(srcs[1], 0, kv_r.start, kv_r.stop))
            pieces.append(read(srcs[2], 0, kv_r.start, kv_r.stop))
        return torch.cat(pieces, 0)
    if kind == "fc1":
        f = hf_shape(spec, srcs[0])[0] // tp
        return torch.cat([read(s, 0, rank * f, (rank + 1) * f) for s in srcs], 0)
    if kind == "row":
        cols = hf_shape(spec, srcs[0])[1] // tp
        return read(srcs[0], 1, rank * cols, (rank + 1) * cols)
    return read(srcs[0], None, 0, 0)


def hf_to_megatron_full(spec: ModelSpec, name: str, hf: dict[str, torch.Tensor], padded_vocab: int):
    """The full megatron tensor from whole HF tensors (TP = 1)."""

    def read(n: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        t = hf[n]
        return t if dim is None else t.narrow(dim, start, stop - start)

    return hf_to_megatron_shard(spec, name, read, 1, 0, padded_vocab)


def megatron_full_to_hf(spec: ModelSpec, name: str, full: torch.Tensor) -> dict[str, torch.Tensor]:
    """Whole HF tensors from one full megatron tensor (padding removed, fused groups split)."""
    kind = shard_kind(name)
    srcs = hf_sources(spec, name)
    if kind == "vocab":
        return {srcs[0]: full[: spec.vocab_size]}
    if kind == "qkv":
        q_rows = spec.heads_per_group * spec.head_dim
        per_group = full.split([q_rows, spec.head_dim, spec.head_dim] * spec.num_query_groups, 0)
        q = torch.cat(per_group[0::3], 0)
        k = torch.cat(per_group[1::3], 0)
        v = torch.cat(per_group[2::3], 0)
        return {srcs[0]: q, srcs[1]: k, srcs[2]: v}
    if kind == "fc1":
        gate, up = full.chunk(2, 0)
        return {srcs[0]: gate, srcs[1]: up}
    return {srcs[0]: full}
