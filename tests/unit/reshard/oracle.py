"""Independent oracles for the reshard: engine tensors sliced straight from whole HF tensors.

Written from vLLM's loader rules (`QKVParallelLinear.weight_loader`: q heads chunked over TP, KV
head `tp_rank // num_kv_head_replicas`; `VocabParallelEmbedding`: vocab padded to 64 rows, split
over TP, rows past the vocabulary zero; `MergedColumnParallelLinear`: `[gate_r; up_r]`;
`RowParallelLinear`: columns chunked) with `torch.chunk`, not with the reshard's run layouts,
so a mistake in those shows up as a mismatch here. Trainer shards come from hf.py's
`hf_to_megatron_shard`, which is what `load_hf_into` writes into megatron's parameters.
"""

from __future__ import annotations

import torch

from megatron_rl.models.hf import all_hf_names, hf_shape, hf_to_megatron_shard


def random_hf(spec, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(hf_shape(spec, n), generator=g).to(dtype) for n in all_hf_names(spec)}


def _vocab_rows(full: torch.Tensor, vocab: int, etp: int, t: int) -> torch.Tensor:
    padded = -(-vocab // 64) * 64
    rows = padded // etp
    out = torch.zeros(rows, full.shape[1], dtype=full.dtype)
    start, stop = t * rows, min((t + 1) * rows, vocab)
    if stop > start:
        out[: stop - start] = full[start:stop]
    return out


def _kv(full: torch.Tensor, groups: int, etp: int, t: int) -> torch.Tensor:
    if etp <= groups:
        return full.chunk(etp, 0)[t]
    return full.chunk(groups, 0)[t // (etp // groups)]  # one KV head, replicated over etp/groups ranks


def vllm_shard(
    spec, hf: dict[str, torch.Tensor], name: str, etp: int, t: int, engine_ep: bool = False
) -> torch.Tensor:
    """What vLLM's loader puts into parameter `name` of TP rank t, given whole HF tensors."""
    if name == "model.embed_tokens.weight":
        return _vocab_rows(hf[name], spec.vocab_size, etp, t)
    if name == "lm_head.weight":
        return _vocab_rows(hf[name], spec.vocab_size, etp, t)
    prefix, leaf = name.rsplit(".", 2)[0], name.rsplit(".", 2)[1:]
    leaf = ".".join(leaf)
    if leaf in ("qkv_proj.weight", "qkv_proj.bias"):
        kind = leaf.split(".")[1]
        q, k, v = (hf[f"{prefix}.{x}_proj.{kind}"] for x in "qkv")
        g = spec.num_query_groups
        return torch.cat([q.chunk(etp, 0)[t], _kv(k, g, etp, t), _kv(v, g, etp, t)])
    if leaf == "gate_up_proj.weight":
        return torch.cat(
            [
                hf[f"{prefix}.gate_proj.weight"].chunk(etp, 0)[t],
                hf[f"{prefix}.up_proj.weight"].chunk(etp, 0)[t],
            ]
        )
    if leaf in ("o_proj.weight", "down_proj.weight"):
        return hf[name].chunk(etp, 1)[t]
    if "routed_experts.w13_weight[" in name or "routed_experts.w2_weight[" in name:
        # FusedMoE at TP without EP (`FusedMoE.weight_loader`): w13[e] = [gate_e chunk t; up_e chunk t]
        # along the FFN rows, w2[e] = down_e's columns chunk t.
        # With expert parallelism (`determine_expert_map`, linear): rank t holds experts t*E/tp.. whole.
        layer = name.split(".mlp.")[0]
        e = int(name.rsplit("[", 1)[1].rstrip("]"))
        if engine_ep:
            e, etp, t = t * (spec.num_experts // etp) + e, 1, 0
        x = f"{layer}.mlp.experts.{e}."
        if "w13_weight" in name:
            return torch.cat(
                [hf[x + "gate_proj.weight"].chunk(etp, 0)[t], hf[x + "up_proj.weight"].chunk(etp, 0)[t]]
            )
        return hf[x + "down_proj.weight"].chunk(etp, 1)[t]
    return hf[name]  # norms and the MoE router: replicated


def vllm_names(spec, experts: int | None = None) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not spec.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        names += [
            p + "input_layernorm.weight",
            p + "post_attention_layernorm.weight",
            p + "self_attn.qkv_proj.weight",
            p + "self_attn.o_proj.weight",
        ]
        if spec.num_experts:
            names.append(p + "mlp.gate.weight")
            names += [
                f"{p}mlp.experts.routed_experts.{w}[{e}]"
                for e in range(spec.num_experts if experts is None else experts)
                for w in ("w13_weight", "w2_weight")
            ]
        else:
            names += [p + "mlp.gate_up_proj.weight", p + "mlp.down_proj.weight"]
        if spec.qkv_bias:
            names.append(p + "self_attn.qkv_proj.bias")
        if spec.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
    return names


def expected_engine_tensors(
    spec, hf, delivery: str, etp: int, t: int, engine_ep: bool = False
) -> dict[str, torch.Tensor]:
    if delivery == "loader":
        return dict(hf)
    experts = spec.num_experts // etp if engine_ep else None
    return {n: vllm_shard(spec, hf, n, etp, t, engine_ep) for n in vllm_names(spec, experts)}


def megatron_shard(spec, hf, name: str, tp: int, rank: int, padded_vocab: int) -> torch.Tensor:
    def read(n, dim, start, stop):
        t = hf[n]
        return t if dim is None else t.narrow(dim, start, stop - start)

    return hf_to_megatron_shard(spec, name, read, tp, rank, padded_vocab)
