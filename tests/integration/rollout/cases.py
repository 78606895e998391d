"""Shared settings of the rollout integration tests: the tiny model the vLLM CPU build can run."""

from __future__ import annotations

from dataclasses import replace

from megatron_rl.config.schema import RolloutConfig
from megatron_rl.models.tiny import tiny_spec

# head_dim 64: the CPU build's attention kernels need it. 256 positions hold a 150-token prompt
# (more than one 128-token KV block, so a stale prefix cache would show) plus a completion.
SPEC = tiny_spec(name="rollout_tiny")
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
