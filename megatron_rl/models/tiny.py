"""Small random HF checkpoints built from a config (no download), for tests, demos and benchmarks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from megatron_rl.models.spec import ModelSpec

_TINY = ModelSpec(
    name="tiny_qwen2", family="qwen2", num_layers=2, hidden_size=256, ffn_hidden_size=512,
    num_attention_heads=4, num_query_groups=2, head_dim=64, vocab_size=100, make_vocab_size_divisible_by=32,
    max_position_embeddings=256, rope_theta=10000.0, norm_eps=1e-6, qkv_bias=True, qk_norm=False,
    tie_word_embeddings=False, params_dtype="fp32",
)  # fmt: skip


def tiny_spec(**overrides) -> ModelSpec:
    """A 2-layer Qwen2-style spec for tests and benchmarks, with `overrides` applied.

    head_dim 64 by default because the vLLM CPU build's attention kernels need it; vocab 100 pads to
    128 rows, so padding is exercised at TP 1, 2 and 4.
    """
    return replace(_TINY, **overrides)


_HF_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}


def hf_config(spec: ModelSpec, dtype: str = "float32"):
    """The transformers config that describes the same architecture as `spec`."""
    import transformers

    cfg_cls = getattr(transformers, _HF_CLASSES[spec.family][0])
    kw = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.ffn_hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_query_groups,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=spec.tie_word_embeddings,
        torch_dtype=dtype,
    )
    if spec.family == "llama":
        kw["attention_bias"] = spec.qkv_bias
        kw["mlp_bias"] = False
    if spec.is_moe:
        kw.update(
            num_experts=spec.num_experts,
            moe_intermediate_size=spec.moe_ffn_hidden_size,
            num_experts_per_tok=spec.moe_topk,
            norm_topk_prob=spec.moe_norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            output_router_logits=False,
        )
    cfg = cfg_cls(**kw)
    # The model class, as a saved checkpoint names it: vLLM picks its implementation from it (without it,
    # a Qwen3-MoE config resolves to no generative model).
    cfg.architectures = [_HF_CLASSES[spec.family][1]]
    if hasattr(cfg, "rope_parameters"):  # transformers 5: RoPE type, theta and scaling in one dict
        cfg.rope_parameters = rope_parameters(spec)
    elif spec.rope_scaling != "none":
        cfg.rope_scaling = rope_parameters(spec)
    return cfg


def rope_parameters(spec: ModelSpec) -> dict:
    """The HF `rope_parameters` (transformers 5; `rope_scaling` before) of a spec."""
    if spec.rope_scaling == "none":
        return {"rope_type": "default", "rope_theta": spec.rope_theta}
    return {
        "rope_type": spec.rope_scaling,
        "rope_theta": spec.rope_theta,
        "factor": spec.rope_scaling_factor,
        "low_freq_factor": spec.rope_low_freq_factor,
        "high_freq_factor": spec.rope_high_freq_factor,
        "original_max_position_embeddings": spec.rope_original_max_position,
    }


def hf_model(spec: ModelSpec, seed: int = 0, dtype: str = "float32"):
    """A randomly initialised HF model of `spec` (eval mode, fp32 unless told)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, _HF_CLASSES[spec.family][1])(hf_config(spec, dtype))
    _perturb_norms(model)
    return model.eval()


def _perturb_norms(model) -> None:
    """Norm weights start at 1; perturb them so a swapped or missing norm shows in the outputs."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))


# A reward model's padding id: transformers' *ForSequenceClassification scores the last token that is not
# this one, so a batch scored against it must not contain it (or it must end every sequence's padding).
REWARD_PAD_TOKEN_ID = 0


def hf_reward_model(spec: ModelSpec, seed: int = 0, dtype: str = "float32"):
    """A randomly initialised HF `<Family>ForSequenceClassification` of `spec` with one label (a learned
    reward model, or a critic's starting point): eval mode, fp32 unless told.

    `pad_token_id` is REWARD_PAD_TOKEN_ID (transformers refuses batches of more than one sequence without
    one); the score head is drawn at std 1/sqrt(h), so scores are O(1) and a wrong hidden state shows."""
    import torch
    import transformers

    cfg = hf_config(spec, dtype)
    cls_name = _HF_CLASSES[spec.family][1].replace("ForCausalLM", "ForSequenceClassification")
    cfg.architectures = [cls_name]
    cfg.num_labels = 1
    cfg.pad_token_id = REWARD_PAD_TOKEN_ID
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg)
    _perturb_norms(model)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn_like(model.score.weight) / spec.hidden_size**0.5)
    return model.eval()


def write_hf_checkpoint(spec: ModelSpec, path: str | Path, seed: int = 0) -> Path:
    """Save a random HF checkpoint of `spec` (safetensors + config.json) the way HF writes it."""
    path = Path(path)
    model = hf_model(spec, seed)
    model.save_pretrained(path, safe_serialization=True)
    return path


def write_hf_reward_model(spec: ModelSpec, path: str | Path, seed: int = 0) -> Path:
    """Save a random one-label HF sequence-classification checkpoint of `spec` (`hf_reward_model`):
    safetensors + config.json, `score.weight` [1, h] in place of an LM head."""
    path = Path(path)
    hf_reward_model(spec, seed).save_pretrained(path, safe_serialization=True)
    return path
