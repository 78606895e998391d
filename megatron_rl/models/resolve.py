"""The model a recipe means: its checkpoint's config.json, with the recipe's own keys checked against it.

A user with `model.hf_checkpoint` should not retype a model's shape into YAML, and a recipe whose
shape disagrees with the checkpoint it loads is a run that dies ~20 s into torchrun on every rank (or
worse, a Llama-3.1 trained without its RoPE scaling). So, when the checkpoint is set:
- every model key the recipe leaves unset (null) is read from config.json (`resolve_model`);
- every key the recipe does set must agree with config.json, or the recipe check refuses it naming
  the key (`disagreements`).
Without a checkpoint the recipe states the shape, and the keys that have a family default
(`FAMILY_DEFAULTS`, `DEFAULTS`) take it. Pure Python and json: `validate` runs it on a laptop.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import replace
from pathlib import Path

from megatron_rl.config.problem import Problem

# Keys that a checkpoint's config.json determines, and that a recipe without one must state.
REQUIRED = (
    "family",
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "vocab_size",
)
# Keys with a default when neither the recipe nor a checkpoint gives them.
DEFAULTS = {
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_scaling": "none",
    "rope_scaling_factor": 1.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_position": 0,
}
# Architecture facts of each family (HF's Qwen2 always has QKV biases; Qwen3 normalises Q and K).
FAMILY_DEFAULTS = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
    "qwen3_moe": {"qkv_bias": False, "qk_norm": True, "moe_norm_topk_prob": False},  # HF's default
}
# config.json model_type -> family
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe"}
# The keys a mixture-of-experts family requires (a recipe without a checkpoint states them).
MOE_REQUIRED = ("num_experts", "moe_ffn_hidden_size", "moe_topk")
ROPE_TYPES = ("none", "llama3")  # what trainer and engine both implement
# The keys compared with a checkpoint (name, params_dtype and the padding multiple are the recipe's).
COMPARED = REQUIRED + (
    "head_dim",
    "max_position_embeddings",
    "rope_theta",
    "norm_eps",
    "qkv_bias",
    "qk_norm",
    "tie_word_embeddings",
    "rope_scaling",
    "rope_scaling_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_position",
    "num_experts",
    "moe_ffn_hidden_size",
    "moe_topk",
    "moe_norm_topk_prob",
)


class CheckpointConfigError(ValueError):
    """config.json exists but cannot be read as a model this project trains."""


def read_config(hf_dir: str | os.PathLike | None) -> dict | None:
    """The checkpoint's config.json as a dict; None when there is no readable checkpoint here."""
    if not hf_dir:
        return None
    path = Path(hf_dir) / "config.json"
    try:
        stat = path.stat()
    except OSError:
        return None
    return dict(_read_json(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _read_json(path: str, mtime_ns: int, size: int) -> tuple:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointConfigError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointConfigError(f"{path} must hold a JSON object")
    return tuple(data.items())


def fields_from_config(cfg: dict, where: str = "config.json") -> dict:
    """Our model keys from an HF config.json (transformers 4 and 5 spellings of RoPE both read)."""
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointConfigError(
            f"{where}: model_type={model_type!r} is not a family this project trains ({', '.join(MODEL_TYPES)})"
        )
    family = MODEL_TYPES[model_type]
    _refuse_unimplemented(cfg, family, where)
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "num_experts", "num_local_experts",
                "moe_intermediate_size", "num_experts_per_tok"):  # fmt: skip
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise CheckpointConfigError(f"{where}: {key}={value!r} must be a positive integer")
    for key in ("rms_norm_eps", "rope_theta"):
        value = cfg.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        ):
            raise CheckpointConfigError(f"{where}: {key}={value!r} must be a positive number")
    heads = cfg.get("num_attention_heads")
    out = {
        "family": family,
        "num_layers": cfg.get("num_hidden_layers"),
        "hidden_size": cfg.get("hidden_size"),
        "ffn_hidden_size": cfg.get("intermediate_size"),
        "num_attention_heads": heads,
        "num_query_groups": cfg.get("num_key_value_heads") or heads,
        "vocab_size": cfg.get("vocab_size"),
        "max_position_embeddings": cfg.get("max_position_embeddings"),
        "norm_eps": cfg.get("rms_norm_eps"),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "qkv_bias": FAMILY_DEFAULTS[family]["qkv_bias"],  # attention_bias was refused above
        "qk_norm": FAMILY_DEFAULTS[family]["qk_norm"],
    }
    if family == "qwen3_moe":
        # transformers 5 writes `num_local_experts` (its attribute map of `num_experts`); 4 wrote `num_experts`.
        out["num_experts"] = cfg.get("num_experts", cfg.get("num_local_experts"))
        out["moe_ffn_hidden_size"] = cfg.get("moe_intermediate_size")
        out["moe_topk"] = cfg.get("num_experts_per_tok")
        out["moe_norm_topk_prob"] = bool(cfg.get("norm_topk_prob", False))
        hf_keys = {"num_experts": "num_experts", "moe_ffn_hidden_size": "moe_intermediate_size",
                   "moe_topk": "num_experts_per_tok"}  # fmt: skip
        missing = [hf_keys[k] for k in MOE_REQUIRED if out[k] is None]
        if missing:
            raise CheckpointConfigError(f"{where} lacks the mixture-of-experts keys {', '.join(missing)}")
        if out["moe_topk"] > out["num_experts"]:
            raise CheckpointConfigError(
                f"{where}: num_experts_per_tok={out['moe_topk']} exceeds num_experts={out['num_experts']}"
            )
    if cfg.get("head_dim"):
        out["head_dim"] = cfg["head_dim"]
    elif heads and cfg.get("hidden_size"):
        out["head_dim"] = cfg["hidden_size"] // heads
    legacy, params = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    for name, value in (("rope_scaling", legacy), ("rope_parameters", params)):
        if value is not None and not isinstance(value, dict):
            raise CheckpointConfigError(f"{where}: {name} must be an object; got {value!r}")
    if legacy and params and _rope_type(legacy) != _rope_type(params):
        raise CheckpointConfigError(
            f"{where}: rope_scaling ({_rope_type(legacy)}) and rope_parameters ({_rope_type(params)}) disagree"
        )
    rope = params or legacy or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta"))
    if theta is not None:
        out["rope_theta"] = float(theta)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        out["rope_scaling"] = "none"
    else:
        out["rope_scaling"] = kind
        out["rope_scaling_factor"] = float(rope.get("factor", 1.0))
        if kind == "llama3":
            out["rope_low_freq_factor"] = float(rope.get("low_freq_factor", 1.0))
            out["rope_high_freq_factor"] = float(rope.get("high_freq_factor", 4.0))
            out["rope_original_max_position"] = int(rope.get("original_max_position_embeddings", 8192))
    missing = [k for k in REQUIRED if out.get(k) is None]
    if missing:
        raise CheckpointConfigError(f"{where} lacks {', '.join(missing)}")
    return {k: v for k, v in out.items() if v is not None}


def _rope_type(rope: dict) -> str:
    kind = rope.get("rope_type", rope.get("type", "default"))
    return "default" if kind is None else kind


def _refuse_unimplemented(cfg: dict, family: str, where: str) -> None:
    """Architecture switches that change the model and that trainer and engine do not both implement:
    accepting them would train a different model than the checkpoint (vLLM and transformers honour
    them; megatron-core's spec here does not)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointConfigError(f"{where}: hidden_act={act!r}; only SwiGLU (silu) MLPs are implemented")
    layer_types = cfg.get("layer_types") or []
    if cfg.get("use_sliding_window") or "sliding_attention" in layer_types:
        raise CheckpointConfigError(f"{where}: sliding-window attention is not implemented by the trainer")
    partial = cfg.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise CheckpointConfigError(
            f"{where}: partial_rotary_factor={partial!r}; only full RoPE is implemented"
        )
    if cfg.get("mlp_bias"):
        raise CheckpointConfigError(f"{where}: mlp_bias=true; MLP biases are not implemented")
    if family == "qwen3_moe":
        sparse_step, dense_layers = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
        if sparse_step != 1 or dense_layers:
            raise CheckpointConfigError(
                f"{where}: decoder_sparse_step={sparse_step!r}, mlp_only_layers={dense_layers!r}: only models "
                "whose every layer is a mixture of experts are implemented (decoder_sparse_step 1, no "
                "mlp_only_layers)"
            )
        if cfg.get("shared_expert_intermediate_size"):
            raise CheckpointConfigError(
                f"{where}: shared_expert_intermediate_size is set; Qwen3-MoE has no shared expert and a "
                "shared expert is not implemented"
            )
    if family in ("llama", "qwen3", "qwen3_moe") and cfg.get("attention_bias"):
        raise CheckpointConfigError(
            f"{where}: attention_bias=true (a bias on q, k, v and o_proj); only Qwen2's q/k/v biases are implemented"
        )


def checkpoint_fields(model) -> dict | None:
    """The model keys `model.hf_checkpoint`'s config.json gives; None when it cannot be read here."""
    cfg = read_config(model.hf_checkpoint)
    if cfg is None:
        return None
    return fields_from_config(cfg, f"{model.hf_checkpoint}/config.json")


def resolve_model(model):
    """A copy of the recipe's model group with every unset key filled: from the checkpoint's config.json
    when it is readable here, then the family's and the project's defaults. Keys the recipe sets win
    (`disagreements` names those that differ from the checkpoint)."""
    filled = {}
    ckpt = checkpoint_fields(model) or {}
    for key in COMPARED:
        if getattr(model, key) is None and key in ckpt:
            filled[key] = ckpt[key]
    family = filled.get("family", model.family)
    for key, value in {**DEFAULTS, **FAMILY_DEFAULTS.get(family, {})}.items():
        if getattr(model, key) is None and key not in filled:
            filled[key] = value
    if not model.name and model.hf_checkpoint:
        filled["name"] = Path(model.hf_checkpoint).name
    return replace(model, **filled) if filled else model


def disagreements(model) -> list[Problem]:
    """Recipe keys that differ from the checkpoint's config.json: the checkpoint is the truth."""
    try:
        ckpt = checkpoint_fields(model)
    except CheckpointConfigError as e:
        return [Problem("model.hf_checkpoint", model.hf_checkpoint, str(e))]
    if ckpt is None:
        return []
    return [
        Problem(
            f"model.{key}",
            mine,
            f"but {model.hf_checkpoint}/config.json says {theirs!r}; the checkpoint is the truth: "
            f"remove model.{key} from the recipe (it is read from the checkpoint) or point "
            "model.hf_checkpoint at the model you mean",
        )
        for key, mine, theirs in differences(model, ckpt)
    ]


def differences(model, ckpt: dict) -> list[tuple[str, object, object]]:
    """(key, ours, the checkpoint's) for every compared key that `model` (a model group or a ModelSpec)
    sets and `ckpt` (`fields_from_config`) gives differently; floats equal to 1e-9 relative."""
    out = []
    for key in COMPARED:
        mine = getattr(model, key, None)
        if mine is None or key not in ckpt:
            continue
        theirs = ckpt[key]
        if isinstance(theirs, float):
            same = abs(mine - theirs) <= 1e-9 * max(abs(theirs), 1.0)
        else:
            same = mine == theirs
        if not same:
            out.append((key, mine, theirs))
    return out


def model_problems(model) -> list[Problem]:
    """Required keys still unset after resolution: the recipe must state them, or the checkpoint be readable."""
    out = []
    unset = [key for key in REQUIRED if getattr(model, key) is None]
    if unset and model.hf_checkpoint:  # one line: the shape comes from a checkpoint not readable here
        built = f" (launch_local builds it: model.fixture={model.fixture})" if model.fixture else ""
        out.append(
            Problem(
                "model.hf_checkpoint",
                model.hf_checkpoint,
                f"has no readable config.json here{built}, so the model's shape ({', '.join(unset)}) is "
                "unknown and the recipe is checked without it",
                "unknown",
            )
        )
    elif unset:
        out += [
            Problem(f"model.{key}", None, "is required when model.hf_checkpoint is not set") for key in unset
        ]
    if model.family == "qwen3_moe" and not unset:
        out += [
            Problem(
                f"model.{key}", getattr(model, key), "is required for a mixture-of-experts family (qwen3_moe)"
            )
            for key in MOE_REQUIRED
            if not getattr(model, key)
        ]
        out += moe_problems(model)
    elif model.family is not None and model.family != "qwen3_moe":
        out += [
            Problem(f"model.{key}", getattr(model, key), f"is set but model.family={model.family} is dense; "
                    "set model.family=qwen3_moe or remove it")
            for key in MOE_REQUIRED
            if getattr(model, key)
        ]  # fmt: skip
    if model.rope_scaling is not None and model.rope_scaling not in ROPE_TYPES:
        out.append(
            Problem(
                "model.rope_scaling",
                model.rope_scaling,
                f"must be one of {', '.join(ROPE_TYPES)}: trainer and engine implement those RoPE types "
                "(YaRN and others are not supported yet)",
            )
        )
    return out


def moe_problems(model) -> list[Problem]:
    """Routing settings megatron-core cannot build."""
    experts, topk = model.num_experts or 0, model.moe_topk or 0
    if experts and topk > experts:
        return [Problem("model.moe_topk", topk, f"exceeds model.num_experts={experts}")]
    if topk == 1 and model.moe_norm_topk_prob:
        # Renormalised over one expert, its weight is always 1.0: megatron-core's router refuses this
        # (TransformerConfig: "use --moe-router-pre-softmax when topk is 1").
        return [
            Problem(
                "model.moe_norm_topk_prob",
                True,
                "with model.moe_topk=1 the renormalised weight is always 1.0, which megatron-core's router "
                "does not build; set it false (the expert's softmax weight)",
            )
        ]
    return []


def tokenizer_size(hf_dir: str | os.PathLike) -> int | None:
    """1 + the largest token id of the checkpoint's tokenizer.json (None without one); read as JSON, so
    `validate` needs neither transformers nor the tokenizers library."""
    path = Path(hf_dir) / "tokenizer.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):  # BPE / WordPiece: token -> id
        ids = list(vocab.values())
    elif isinstance(vocab, list):  # Unigram: [piece, score] pairs, ids by position
        ids = [len(vocab) - 1] if vocab else []
    else:
        ids = []
    ids += [t.get("id", -1) for t in data.get("added_tokens", []) or [] if isinstance(t, dict)]
    ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
    return max(ids) + 1 if ids else None


def tokenizer_problems(model) -> list[Problem]:
    """A tokenizer whose ids reach past the embedding: the first such id would index out of range."""
    if not model.hf_checkpoint or model.vocab_size is None:
        return []
    size = tokenizer_size(model.hf_checkpoint)
    if size is None or size <= model.vocab_size:
        return []
    return [
        Problem(
            "model.vocab_size",
            model.vocab_size,
            f"but the tokenizer in {model.hf_checkpoint} has ids up to {size - 1}; the embedding needs at "
            "least that many rows (is this the tokenizer of another model?)",
        )
    ]
