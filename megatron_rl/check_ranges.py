"""Every number of a recipe in its range, every enumeration one of its values.

Part of the one recipe check (check.py): what a key is allowed to hold on its own, before any rule
relates two keys. `NUMERIC` maps each numeric key to (low, high, low inclusive, high inclusive); a test
asserts that every numeric key of the schema has an entry. Values must be finite, and integers at most
2^40, whatever their range.
"""

from __future__ import annotations

import math

from megatron_rl.config.choices import (
    DISAGREEMENT_ACTIONS,
    FAMILIES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    OLD_LOGPROBS,
    OVERLONG_MODES,
    REFERENCE_PLACEMENTS,
    REFUSAL_POLICIES,
    REWARD_KINDS,
    REWARD_MODES,
)
from megatron_rl.config.problem import Problem
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.models.dtypes import RECIPE_DTYPES
from megatron_rl.rollout.delivery import SLEEP_LEVELS

MIN_DIST_TIMEOUT_S = 60.0

ENUMS = {
    "model.family": FAMILIES,
    "model.params_dtype": RECIPE_DTYPES,
    "model.fixture": ("", "qwen2", "qwen3", "llama", "qwen3_moe"),
    "algorithm.name": ("grpo",),
    "algorithm.kl_estimator": KL_ESTIMATORS,
    "algorithm.loss_agg": LOSS_AGGREGATIONS,
    "algorithm.overlong": OVERLONG_MODES,
    "algorithm.reference": REFERENCE_PLACEMENTS,
    "algorithm.old_logprobs": OLD_LOGPROBS,
    "rollout.engine": ("vllm",),
    "rollout.on_refused_publication": REFUSAL_POLICIES,
    "rollout.on_logprob_disagreement": DISAGREEMENT_ACTIONS,
    "rollout.dtype": ("", *RECIPE_DTYPES),
    "rollout.sleep_level": SLEEP_LEVELS,
    "reward.kind": REWARD_KINDS,
    "reward.mode": REWARD_MODES,
    "optim.lr_schedule": ("constant", "cosine"),
}

# Every numeric key of the schema and its range: (low, high, low inclusive, high inclusive); None =
# unbounded. Numbers must also be finite. tests/unit/config/test_check.py proves no numeric key of
# the schema is missing here, so a new key cannot skip its range check (enumerated numbers are in
# ENUMS; temperature, top-p and top-k belong to the sampling convention, rollout/convention.py).
GE1 = (1, None, True, False)
GE0 = (0, None, True, False)
GT0 = (0, None, False, False)
FRACTION = (0, 1, False, True)
NUMERIC: dict[str, tuple] = {
    "steps": GE1,
    "seed": GE0,
    **{
        f"model.{k}": GE1
        for k in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "head_dim",
            "vocab_size",
            "make_vocab_size_divisible_by",
            "max_position_embeddings",
            "num_experts",
            "moe_ffn_hidden_size",
            "moe_topk",
        )
    },
    "model.moe_aux_loss_coeff": GE0,
    "model.moe_z_loss_coeff": GE0,
    "model.rope_theta": GT0,
    "model.rope_scaling_factor": GE1,
    "model.rope_low_freq_factor": GT0,
    "model.rope_high_freq_factor": GT0,
    "model.rope_original_max_position": GE0,
    "model.norm_eps": (0, 1, False, False),
    **{f"layout.{k}": GE1 for k in ("tp", "pp", "dp", "cp", "ep", "etp", "engine_tp", "engine_count")},
    "layout.pp_layers": GE1,
    "algorithm.clip_low": (0, 1, True, False),
    "algorithm.clip_high": GE0,
    "algorithm.kl_coef": GE0,
    "algorithm.minibatches": GE1,
    "algorithm.max_resample_rounds": GE0,
    "algorithm.overlong_penalty_tokens": GE0,
    "algorithm.truncated_is_cap": GE0,
    "rollout.samples_per_prompt": GE1,
    "rollout.max_new_tokens": GE1,
    "rollout.mean_completion_tokens": GE1,
    "rollout.stop_token_ids": GE0,
    "rollout.gpu_memory_utilization": FRACTION,
    "rollout.kv_cache_bytes": GE0,
    "rollout.seed": GE0,
    "rollout.logprob_max_gap": GE0,
    "rollout.logprob_mean_gap": GE0,
    "rollout.logprob_probe_prompts": (0, 64, True, True),
    "rollout.logprob_probe_tokens": (1, 256, True, True),
    "rollout.max_refused_publications": GE1,
    "rollout.max_staleness": GE0,
    "rollout.oversample": GE1,
    "rollout.partial_max_cuts": (1, 16, True, True),
    "reward.workers": GE1,
    "reward.timeout_s": GT0,
    "reward.memory_mb": (16, None, True, False),
    "reward.pool_cores": GE1,
    "reward.seconds_per_sample": GE0,
    "data.prompts_per_step": GE1,
    "data.prompt_tokens": GE1,
    "data.max_prompt_tokens": GE1,
    "data.seed": GE0,
    "data.tail_share": (0, 1, True, False),
    "data.short_answer_tokens": GE1,
    "optim.lr": GE0,
    "optim.min_lr": GE0,
    "optim.weight_decay": GE0,
    "optim.adam_beta1": (0, 1, True, False),
    "optim.adam_beta2": (0, 1, True, False),
    "optim.adam_eps": GT0,
    "optim.clip_grad": GE0,
    "optim.warmup_steps": GE0,
    "optim.micro_batch_size": GE1,
    "checkpoint.interval": (-1, None, True, False),
    "checkpoint.keep_last": GE0,
    "checkpoint.keep_every": GE0,
    "cluster.nodes": GE1,
    "cluster.gpus_per_node": GE1,
    "cluster.gpu_memory_gib": GT0,
    "cluster.hbm_bandwidth_tbps": GT0,
    "cluster.peak_tflops_bf16": GT0,
    "cluster.nvlink_gbps": GT0,
    "cluster.ib_gbps_per_nic": GT0,
    "cluster.nics_per_node": GE1,
    "cluster.storage_gbps": GT0,
    "cluster.node_mtbf_days": GT0,
    "cluster.allreduce_latency_us": GE0,
    "cluster.dist_timeout_s": (MIN_DIST_TIMEOUT_S, None, True, False),
    "plan.train_mfu": FRACTION,
    "plan.generation_bw_fraction": FRACTION,
    "plan.target_steps": GE1,
    "plan.target_hours": GT0,
    "plan.publish_pack_s": GE0,
    "plan.publish_install_s": GE0,
    "plan.publish_validate_s": GE0,
}

# Why a bound is what it is, where the bare range would not tell a user how to fix it.
RANGE_HINTS = {
    "cluster.dist_timeout_s": "seconds a rank may wait in a collective for the slowest rank; 1800 is the "
    "default, raise it for very long completions",
    "checkpoint.interval": "N > 0 steps, -1 for the planner's Young/Daly interval, 0 for never",
    "checkpoint.keep_last": "0 keeps every checkpoint",
    "rollout.gpu_memory_utilization": "the share of the GPU the engine claims",
    "reward.memory_mb": "each scoring job's memory limit",
    "model.norm_eps": "a small positive epsilon, e.g. 1e-6",
}


def get_key(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _range_text(lo, hi, lo_in, hi_in) -> str:
    if hi is None:
        return f"{'>=' if lo_in else '>'} {lo}"
    return f"in {'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"


# No count, size or id in a recipe comes near this; larger ones overflow the float arithmetic of the
# planner and the int32/int64 indices of torch.
MAX_INT = 2**40


def _out_of_range(value, rng) -> bool:
    lo, hi, lo_in, hi_in = rng
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    if isinstance(value, int) and abs(value) > MAX_INT:
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return True
    if lo is not None and (value < lo or (value == lo and not lo_in)):
        return True
    return hi is not None and (value > hi or (value == hi and not hi_in))


def numeric_problems(cfg: RecipeConfig) -> list[Problem]:
    """Every number outside its range (NaN and infinities included); lists are checked item by item."""
    out = []
    for key, rng in NUMERIC.items():
        value = get_key(cfg, key)
        if value is None:  # optional (model.head_dim)
            continue
        items = list(value) if isinstance(value, list | tuple) else [value]
        if any(_out_of_range(v, rng) for v in items):
            hint = f" ({RANGE_HINTS[key]})" if key in RANGE_HINTS else ""
            what = "every entry must be" if isinstance(value, list | tuple) else "must be finite and"
            if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT for v in items):
                hint += " (and at most 2^40)"
            out.append(Problem(key, value, f"{what} {_range_text(*rng)}{hint}"))
    return out
