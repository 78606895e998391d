"""Every number of a recipe in its range, every enumeration one of its values.

Part of the one recipe check (check/recipe.py): what a key is allowed to hold on its own, before any rule
relates two keys. `NUMERIC` maps each numeric key to (low, high, low inclusive, high inclusive); a test
asserts that every numeric key of the schema has an entry, and that every entry has an upper bound.
The upper bounds are what a real run could need, generously (a scoring job of a day, 65,536 samples
per prompt, a million GPUs, 4 TiB of memory per scoring job): past them a value is a typo or a unit
slip (seconds given as milliseconds), and would overflow a timer or an allocation long after start.
Values must also be finite, and integers at most 2^40, whatever their range.
"""

from __future__ import annotations

import math

from megatron_rl.algorithms.names import KL_ESTIMATORS, LOSS_AGGREGATIONS, OLD_LOGPROBS
from megatron_rl.config.choices import (
    ADVANTAGE_WHITENING,
    ALGORITHMS,
    DISAGREEMENT_ACTIONS,
    FAMILIES,
    OVERLONG_MODES,
    REFERENCE_PLACEMENTS,
    REFUSAL_POLICIES,
    REWARD_KINDS,
    REWARD_MODES,
)
from megatron_rl.config.problem import Problem
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.models.dtypes import RECIPE_DTYPES
from megatron_rl.reward.sandbox import MAX_TIMEOUT_S
from megatron_rl.rollout.delivery import SLEEP_LEVELS

MIN_DIST_TIMEOUT_S = 60.0

ENUMS = {
    "model.family": FAMILIES,
    "model.params_dtype": RECIPE_DTYPES,
    "model.fixture": ("", "qwen2", "qwen3", "llama", "qwen3_moe"),
    "algorithm.name": ALGORITHMS,
    "algorithm.advantage_whiten": ADVANTAGE_WHITENING,
    "critic.lr_schedule": ("constant", "cosine"),
    "critic.recompute": ("", "none", "selective", "full"),
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

# Every numeric key of the schema and its range: (low, high, low inclusive, high inclusive). Numbers
# must also be finite. tests/unit/check/test_check.py proves no numeric key of the schema is missing
# here and none lacks an upper bound, so a new key cannot skip its range check (enumerated numbers are
# in ENUMS; temperature, top-p and top-k belong to the sampling convention, rollout/convention.py).
DAY_S = float(MAX_TIMEOUT_S)  # a wall-clock limit of a day: the longest wait a run could mean
SEEDS = (0, 2**32 - 1, True, True)  # numpy's and most libraries' seed range
TOKENS = 1 << 24  # 16M tokens: past any context or completion length
GPUS = 1 << 20  # a million GPUs (or CPU workers) in one job
STEPS = 10**8


def _ge(lo: float, hi: float) -> tuple:
    return (lo, hi, True, True)


def _gt(lo: float, hi: float) -> tuple:
    return (lo, hi, False, True)


FRACTION = (0, 1, False, True)
NUMERIC: dict[str, tuple] = {
    "steps": _ge(1, STEPS),
    "seed": SEEDS,
    "model.num_layers": _ge(1, 4096),
    "model.hidden_size": _ge(1, 1 << 20),
    "model.ffn_hidden_size": _ge(1, 1 << 22),
    "model.num_attention_heads": _ge(1, 8192),
    "model.num_query_groups": _ge(1, 8192),
    "model.head_dim": _ge(1, 1 << 16),
    "model.vocab_size": _ge(1, TOKENS),
    "model.make_vocab_size_divisible_by": _ge(1, 1 << 16),
    "model.max_position_embeddings": _ge(1, TOKENS),
    "model.num_experts": _ge(1, 1 << 16),
    "model.moe_ffn_hidden_size": _ge(1, 1 << 22),
    "model.moe_topk": _ge(1, 1 << 16),
    "model.moe_aux_loss_coeff": _ge(0, 1e3),
    "model.moe_z_loss_coeff": _ge(0, 1e3),
    "model.rope_theta": _gt(0, 1e12),
    "model.rope_scaling_factor": _ge(1, 1e4),
    "model.rope_low_freq_factor": _gt(0, 1e4),
    "model.rope_high_freq_factor": _gt(0, 1e4),
    "model.rope_original_max_position": _ge(0, TOKENS),
    "model.norm_eps": (0, 1, False, False),
    **{
        f"layout.{k}": _ge(1, GPUS)
        for k in ("tp", "pp", "dp", "cp", "ep", "etp", "engine_tp", "engine_count")
    },
    "layout.pp_layers": _ge(1, 4096),
    "algorithm.clip_low": (0, 1, True, False),
    "algorithm.clip_high": _ge(0, 1e3),
    "algorithm.kl_coef": _ge(0, 1e3),
    "algorithm.minibatches": _ge(1, 1 << 20),
    "algorithm.max_resample_rounds": _ge(0, 10**4),
    "algorithm.overlong_penalty_tokens": _ge(0, TOKENS),
    "algorithm.truncated_is_cap": _ge(0, 1e6),
    "algorithm.epochs": _ge(1, 1 << 10),
    "algorithm.gamma": _ge(0, 1),
    "algorithm.lam": _ge(0, 1),
    "algorithm.value_clip": _ge(0, 1e6),
    "critic.lr": _ge(0, 10),
    "critic.min_lr": _ge(0, 10),
    "critic.weight_decay": _ge(0, 10),
    "critic.adam_beta1": (0, 1, True, False),
    "critic.adam_beta2": (0, 1, True, False),
    "critic.adam_eps": _gt(0, 1),
    "critic.clip_grad": _ge(0, 1e6),
    "critic.warmup_steps": _ge(0, STEPS),
    "critic.critic_only_steps": _ge(0, STEPS),
    "critic.epochs": _ge(0, 1 << 10),
    "critic.tp": _ge(0, GPUS),
    "critic.pp": _ge(0, GPUS),
    "critic.micro_batch_size": _ge(0, 1 << 20),
    "rollout.samples_per_prompt": _ge(1, 1 << 16),
    "rollout.max_new_tokens": _ge(1, TOKENS),
    "rollout.mean_completion_tokens": _ge(1, TOKENS),
    "rollout.stop_token_ids": _ge(0, TOKENS),
    "rollout.gpu_memory_utilization": FRACTION,
    "rollout.kv_cache_bytes": _ge(0, 1 << 50),
    "rollout.seed": SEEDS,
    "rollout.logprob_max_gap": _ge(0, 1e3),
    "rollout.logprob_mean_gap": _ge(0, 1e3),
    "rollout.logprob_probe_prompts": (0, 64, True, True),
    "rollout.logprob_probe_tokens": (1, 256, True, True),
    "rollout.max_refused_publications": _ge(1, 10**6),
    "rollout.max_staleness": _ge(0, 10**4),
    "rollout.oversample": _ge(1, 1e3),
    "rollout.partial_max_cuts": (1, 16, True, True),
    "rollout.max_turns": (1, 64, True, True),
    "rollout.turn_max_tokens": _ge(0, TOKENS),
    "rollout.observation_max_tokens": _ge(1, TOKENS),
    "rollout.turn_penalty": _ge(0, 1e3),
    "rollout.env_timeout_s": _gt(0, DAY_S),
    "reward.workers": _ge(1, GPUS),
    "reward.timeout_s": _gt(0, DAY_S),
    "reward.memory_mb": _ge(16, 1 << 22),
    "reward.pool_cores": _ge(1, GPUS),
    "reward.fleet_nodes": _ge(0, 10**5),
    "reward.fleet_cpus_per_node": _ge(1, 10**4),
    "reward.seconds_per_sample": _ge(0, DAY_S),
    "reward.model_weight": _ge(-1e6, 1e6),
    "reward.verifier_weight": _ge(-1e6, 1e6),
    "reward.endpoints_wait_s": _ge(0, DAY_S),
    "reward.remote_timeout_s": _gt(0, DAY_S),
    "reward.remote_attempts": _ge(1, 1000),
    "reward.http_timeout_s": _gt(0, DAY_S),
    "reward.http_retries": _ge(0, 100),
    "data.prompts_per_step": _ge(1, 1 << 24),
    "data.prompt_tokens": _ge(1, TOKENS),
    "data.max_prompt_tokens": _ge(1, TOKENS),
    "data.seed": SEEDS,
    "data.tail_share": (0, 1, True, False),
    "data.short_answer_tokens": _ge(1, TOKENS),
    "optim.lr": _ge(0, 10),
    "optim.min_lr": _ge(0, 10),
    "optim.weight_decay": _ge(0, 100),
    "optim.adam_beta1": (0, 1, True, False),
    "optim.adam_beta2": (0, 1, True, False),
    "optim.adam_eps": _gt(0, 1),
    "optim.clip_grad": _ge(0, 1e6),
    "optim.warmup_steps": _ge(0, STEPS),
    "optim.micro_batch_size": _ge(1, 1 << 20),
    "checkpoint.interval": _ge(-1, STEPS),
    "checkpoint.keep_last": _ge(0, 10**6),
    "checkpoint.keep_every": _ge(0, STEPS),
    "logger.no_signal_steps": _ge(0, STEPS),
    "logger.samples_per_step": _ge(0, 1 << 16),
    "cluster.nodes": _ge(1, GPUS),
    "cluster.gpus_per_node": _ge(1, 1024),
    "cluster.gpu_memory_gib": _gt(0, 1 << 16),
    "cluster.hbm_bandwidth_tbps": _gt(0, 1e4),
    "cluster.peak_tflops_bf16": _gt(0, 1e7),
    "cluster.nvlink_gbps": _gt(0, 1e7),
    "cluster.ib_gbps_per_nic": _gt(0, 1e7),
    "cluster.nics_per_node": _ge(1, 1024),
    "cluster.storage_gbps": _gt(0, 1e7),
    "cluster.node_mtbf_days": _gt(0, 1e6),
    "cluster.allreduce_latency_us": _ge(0, 1e8),
    "cluster.gpu_hour_usd": _ge(0, 1e4),
    "cluster.spot_gpu_hour_usd": _ge(0, 1e4),
    "cluster.spot_preemptions_per_node_day": _ge(0, 1e3),
    "cluster.dist_timeout_s": _ge(MIN_DIST_TIMEOUT_S, DAY_S),
    "cluster.spare_nodes": _ge(0, GPUS),
    "cluster.max_restarts": _ge(0, 1000),
    "cluster.preflight_gemm_fraction": (0, 1, True, True),  # 0: the test always passes
    "cluster.preflight_memory_fraction": (0, 1, True, True),
    "cluster.preflight_allreduce_fraction": (0, 1, True, True),
    "plan.train_mfu": FRACTION,
    "plan.generation_bw_fraction": FRACTION,
    "plan.target_hours": _gt(0, 24 * 365 * 10),
    "plan.publish_pack_s": _ge(0, DAY_S),
    "plan.publish_install_s": _ge(0, DAY_S),
    "plan.publish_validate_s": _ge(0, DAY_S),
}

# Why a bound is what it is, where the bare range would not tell a user how to fix it.
RANGE_HINTS = {
    "cluster.dist_timeout_s": "seconds a rank may wait in a collective for the slowest rank; 1800 is the "
    "default, raise it for very long completions",
    "cluster.spare_nodes": "nodes allocated beyond cluster.nodes, to replace a failed one; 0: none",
    "cluster.max_restarts": "times a job starts the run again after a rank's failure; 0: never",
    "checkpoint.interval": "N > 0 steps, -1 for the planner's Young/Daly interval, 0 for never",
    "checkpoint.keep_last": "0 keeps every checkpoint",
    "logger.no_signal_steps": "steps in a row without a learning signal before the run says so; 0: never",
    "rollout.gpu_memory_utilization": "the share of the GPU the engine claims",
    "reward.memory_mb": "each scoring job's memory limit, MiB (4 TiB at most)",
    "reward.timeout_s": "seconds a scoring job may run; a day at most",
    "rollout.samples_per_prompt": "completions drawn per prompt",
    "model.norm_eps": "a small positive epsilon, e.g. 1e-6",
}


def get_key(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def range_text(lo, hi, lo_in, hi_in) -> str:
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
            out.append(Problem(key, value, f"{what} {range_text(*rng)}{hint}"))
    return out
