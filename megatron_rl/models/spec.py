"""Architecture specs: the numbers every layer of the project agrees on.

A `ModelSpec` is derived once from the recipe's model group and is pure data: the trainer turns it
into a megatron-core `TransformerConfig`, the reshard planner counts its bytes, the capacity planner
its FLOPs. It knows nothing of parallelism except the one thing the vocabulary needs (padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_rl.config.choices import FAMILIES
from megatron_rl.models.dtypes import dtype_bytes


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    make_vocab_size_divisible_by: int
    max_position_embeddings: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    params_dtype: str
    # RoPE scaling (models/resolve.py ROPE_TYPES): none | llama3, and llama3's parameters.
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 0
    # Mixture of experts (Qwen3-MoE): every layer's MLP is `num_experts` SwiGLU experts of
    # `moe_ffn_hidden_size`, `moe_topk` of them per token, chosen by a linear router (softmax over all
    # experts, top-k, renormalised to sum 1 when `moe_norm_topk_prob`). 0 experts = a dense model.
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_topk: int = 0
    moe_norm_topk_prob: bool = True
    # Router losses the trainer adds (0 = off; not architecture: a checkpoint does not fix them).
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0

    @classmethod
    def from_config(cls, m) -> ModelSpec:  # m: config.schema.ModelConfig
        """The spec of the recipe's model group, unset keys read from its checkpoint (models/resolve.py)."""
        from megatron_rl.models.resolve import resolve_model

        m = resolve_model(m)
        if m.family not in FAMILIES:
            raise ValueError(f"model.family={m.family!r} is not one of {FAMILIES}")
        unset = [k for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                             "num_query_groups", "vocab_size") if getattr(m, k) is None]  # fmt: skip
        if unset:
            raise ValueError(
                f"model.{unset[0]} is unset and model.hf_checkpoint={m.hf_checkpoint!r} has no readable "
                "config.json here; state the model's shape in the recipe or run where the checkpoint is"
            )
        return cls(
            name=m.name,
            family=m.family,
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            ffn_hidden_size=m.ffn_hidden_size,
            num_attention_heads=m.num_attention_heads,
            num_query_groups=m.num_query_groups,
            head_dim=m.head_dim or m.hidden_size // m.num_attention_heads,
            vocab_size=m.vocab_size,
            make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
            max_position_embeddings=m.max_position_embeddings,
            rope_theta=m.rope_theta,
            norm_eps=m.norm_eps,
            qkv_bias=m.qkv_bias,
            qk_norm=m.qk_norm,
            tie_word_embeddings=m.tie_word_embeddings,
            params_dtype=m.params_dtype,
            rope_scaling=m.rope_scaling,
            rope_scaling_factor=m.rope_scaling_factor,
            rope_low_freq_factor=m.rope_low_freq_factor,
            rope_high_freq_factor=m.rope_high_freq_factor,
            rope_original_max_position=m.rope_original_max_position,
            num_experts=m.num_experts or 0,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size or 0,
            moe_topk=m.moe_topk or 0,
            moe_norm_topk_prob=True if m.moe_norm_topk_prob is None else m.moe_norm_topk_prob,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_z_loss_coeff=m.moe_z_loss_coeff,
        )

    # ---- shapes ----
    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_query_groups * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.params_dtype, "model.params_dtype")

    def padded_vocab(self, tp: int) -> int:
        """Vocabulary rows after megatron's padding: a multiple of divisible_by x TP."""
        mult = self.make_vocab_size_divisible_by * tp
        return int(math.ceil(self.vocab_size / mult) * mult)

    # ---- counts ----
    def layer_params(self, active: bool = False) -> int:
        """Parameters of one layer; `active`: only those one token uses (its top-k experts and the router)."""
        h = self.hidden_size
        qkv = h * (self.q_size + 2 * self.kv_size) + (self.q_size + 2 * self.kv_size if self.qkv_bias else 0)
        proj = self.q_size * h
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return qkv + proj + self.mlp_params(active) + norms

    def mlp_params(self, active: bool = False) -> int:
        if not self.is_moe:
            return 3 * self.hidden_size * self.ffn_hidden_size
        experts = self.moe_topk if active else self.num_experts
        return self.num_experts * self.hidden_size + experts * self.expert_params()

    def expert_params(self) -> int:
        """One expert's SwiGLU weights (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_ffn_hidden_size

    def num_params(self, padded_vocab: int | None = None, active: bool = False) -> int:
        """All parameters (memory); `active=True`: those one token's forward uses (FLOPs of an MoE)."""
        v = padded_vocab or self.vocab_size
        emb = v * self.hidden_size
        out = 0 if self.tie_word_embeddings else v * self.hidden_size
        return self.num_layers * self.layer_params(active) + emb + out + self.hidden_size

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token of context holds across all layers (K and V)."""
        b = kv_dtype_bytes or self.dtype_bytes
        return 2 * self.num_layers * self.num_query_groups * self.head_dim * b
