"""Shared settings of the rollout integration tests: the tiny model the vLLM CPU build can run."""

from __future__ import annotations

from dataclasses import replace

from megatron_rl.config.schema import RolloutConfig
from megatron_rl.models.spec import ModelSpec

# head_dim 64: the CPU build's attention kernels need it. 256 positions hold a 150-token prompt
# (more than one 128-token KV block, so a stale prefix cache would show) plus a completion.
SPEC = ModelSpec(
    name="rollout_tiny",
    family="qwen2",
    num_layers=2,
    hidden_size=256,
    ffn_hidden_size=512,
    num_attention_heads=4,
    num_query_groups=2,
    head_dim=64,
    vocab_size=100,
    make_vocab_size_divisible_by=32,
    max_position_embeddings=256,
    rope_theta=10000.0,
    norm_eps=1e-6,
    qkv_bias=True,
    qk_norm=False,
    tie_word_embeddings=False,
    params_dtype="fp32",
)
KV_BYTES = 64 << 20
LONG_PROMPT = [(7 * i + 3) % SPEC.vocab_size for i in range(150)]


def rollout_cfg(**kw) -> RolloutConfig:
    base = RolloutConfig(max_new_tokens=16, kv_cache_bytes=KV_BYTES, enforce_eager=True, seed=0)
    return replace(base, **kw)


def write_model_dir(path) -> str:
    """config.json only: the engine starts with load_format='dummy' and waits for a publication."""
    from megatron_rl.models.tiny import hf_config

    hf_config(SPEC).save_pretrained(str(path))
    return str(path)


def peaky_hf_state(seed: int) -> dict:
    """A random HF state dict whose lm_head is scaled 20x: peaked next-token distributions, so a wrong
    weight mapping or a stale cache moves the log-probs by far more than rounding does."""
    from megatron_rl.models.tiny import hf_model

    model = hf_model(SPEC, seed=seed)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd["lm_head.weight"] *= 20
    return sd
