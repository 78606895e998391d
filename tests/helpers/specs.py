"""Tiny model specs shared by tests (build from a config: no download)."""

from __future__ import annotations

from dataclasses import replace

from megatron_rl.models.tiny import tiny_spec

QWEN2_TINY = tiny_spec(
    name="qwen2_tiny", hidden_size=128, ffn_hidden_size=256, head_dim=32, max_position_embeddings=128
)
LLAMA_TINY_TIED = replace(
    QWEN2_TINY,
    name="llama_tiny_tied",
    family="llama",
    qkv_bias=False,
    tie_word_embeddings=True,
    rope_theta=500000.0,
    norm_eps=1e-5,
)
QWEN3_TINY = replace(
    QWEN2_TINY, name="qwen3_tiny", family="qwen3", qkv_bias=False, qk_norm=True, rope_theta=1000000.0
)
# Llama-3.1's RoPE scaling with a tiny original context (8 positions): the test batch's sequences
# (up to 14 tokens) reach the scaled range.
LLAMA31_TINY_SCALED = replace(
    LLAMA_TINY_TIED,
    name="llama31_tiny_scaled",
    tie_word_embeddings=False,
    rope_scaling="llama3",
    rope_scaling_factor=8.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_position=8,
)
# Qwen3-MoE: 4 experts of width 64, top-2, renormalised (as Qwen3-30B-A3B); the dense FFN width is
# unused (every layer is routed) but kept so a dense check of the same spec would fail loudly.
QWEN3_MOE_TINY = replace(
    QWEN3_TINY, name="qwen3_moe_tiny", family="qwen3_moe", num_experts=4, moe_ffn_hidden_size=64, moe_topk=2
)
SPECS = {s.name: s for s in (QWEN2_TINY, LLAMA_TINY_TIED, QWEN3_TINY, LLAMA31_TINY_SCALED)}
