"""The one check of a recipe: whatever the driver would refuse, every command refuses first.

`validate`, `submit`, `launch_local`, the planner and the driver (`train.py`, before it builds
anything) call `check_recipe`; each refuses the kinds of problem that concern it
(config/problem.py): the planner skips layouts the driver cannot run yet and memory it will show
anyway; `validate` and `submit` note paths they cannot read from this machine, which the driver
then refuses on the cluster.

Hydra's structured configs refuse unknown keys and wrong types. This module adds what they cannot
see: every number's range (finite, sign, bounds: `NUMERIC`), the enumerations, the layout against
the model and the cluster (`ParallelLayout.check`), batch and length arithmetic, the sampling
convention, publication settings and the memory fit. All problems are collected, so a user fixes a
recipe in one pass. It sits above `config/`, `layout.py` and `plan/` (it asks the planner for the
memory fit), and nothing below imports it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from megatron_rl.config.problem import ConfigError, Problem
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.layout import ParallelLayout
from megatron_rl.rollout.convention import convention_problems, full_vocab_problem
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for

MIN_DIST_TIMEOUT_S = 60.0
FLOAT32_MAX = 3.4028234663852886e38
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or no limit).
SLURM_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")

ENUMS = {
    "model.family": ("llama", "qwen2", "qwen3"),
    "model.params_dtype": ("bf16", "fp16", "fp32"),
    "algorithm.name": ("grpo",),
    "algorithm.kl_estimator": ("k1", "k2", "k3"),
    "algorithm.loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "algorithm.overlong": ("none", "mask", "penalty"),
    "algorithm.reference": ("resident", "offload"),
    "rollout.engine": ("vllm",),
    "rollout.on_refused_publication": ("stop", "skip", "retry"),
    "rollout.sleep_level": (0, 1, 2),
    "reward.kind": ("sandbox", "function"),
    "reward.mode": ("all_or_nothing", "fraction"),
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
        )
    },
    "model.rope_theta": GT0,
    "model.norm_eps": (0, 1, False, False),
    **{f"layout.{k}": GE1 for k in ("tp", "pp", "dp", "cp", "ep", "engine_tp", "engine_count")},
    "layout.pp_layers": GE1,
    "layout.engine_gpus": GE0,
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
    "rollout.logprob_check_threshold": GT0,
    "rollout.max_refused_publications": GE1,
    "reward.workers": GE1,
    "reward.timeout_s": GT0,
    "reward.memory_mb": (16, None, True, False),
    "reward.pool_cores": GE1,
    "reward.seconds_per_sample": GE0,
    "data.prompts_per_step": GE1,
    "data.prompt_tokens": GE1,
    "data.max_prompt_tokens": GE1,
    "data.seed": GE0,
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


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _range_text(lo, hi, lo_in, hi_in) -> str:
    if hi is None:
        return f"{'>=' if lo_in else '>'} {lo}"
    return f"in {'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"


def _out_of_range(value, rng) -> bool:
    lo, hi, lo_in, hi_in = rng
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    if not math.isfinite(value):
        return True
    if lo is not None and (value < lo or (value == lo and not lo_in)):
        return True
    return hi is not None and (value > hi or (value == hi and not hi_in))


def numeric_problems(cfg: RecipeConfig) -> list[Problem]:
    """Every number outside its range (NaN and infinities included); lists are checked item by item."""
    out = []
    for key, rng in NUMERIC.items():
        value = _get(cfg, key)
        if value is None:  # optional (model.head_dim)
            continue
        items = list(value) if isinstance(value, list | tuple) else [value]
        if any(_out_of_range(v, rng) for v in items):
            hint = f" ({RANGE_HINTS[key]})" if key in RANGE_HINTS else ""
            what = "every entry must be" if isinstance(value, list | tuple) else "must be finite and"
            out.append(Problem(key, value, f"{what} {_range_text(*rng)}{hint}"))
    return out


def check_recipe(cfg: RecipeConfig) -> list[Problem]:
    """Every problem of a recipe, of every kind (empty list = it can run)."""
    out: list[Problem] = []

    def bad(key: str, message: str, kind: str = "recipe") -> None:
        out.append(Problem(key, _get(cfg, key), message, kind))

    for key, allowed in ENUMS.items():
        if _get(cfg, key) not in allowed:
            bad(key, f"must be one of {', '.join(map(str, allowed))}")
    out += numeric_problems(cfg)
    ro = cfg.rollout
    convention = convention_problems(ro.logprobs_mode, ro.temperature, ro.top_p, ro.top_k, training=True)
    out += convention
    if any(p.key in NUMERIC or p.key in ENUMS for p in out):
        return out  # the checks below divide by, compare and look up these

    m, alg, data, cl, opt = cfg.model, cfg.algorithm, cfg.data, cfg.cluster, cfg.optim

    # ---- names (the run's folders and W&B group are named after the recipe) ----
    if not re.fullmatch(r"[\w.+-]{1,128}", cfg.name):
        bad("name", "must be 1-128 letters, digits or . _ + - (it names the run's folders)")
    if not m.name.strip():
        bad("model.name", "must not be empty")

    # ---- model shape ----
    if m.num_attention_heads % m.num_query_groups:
        bad("model.num_query_groups", f"must divide model.num_attention_heads={m.num_attention_heads}")
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        bad(
            "model.hidden_size",
            f"is not a multiple of num_attention_heads={m.num_attention_heads}; set model.head_dim",
        )

    # ---- layout vs model and cluster ----
    layout = ParallelLayout.from_config(cfg.layout)
    out += layout.check(m, cl)
    lay = cfg.layout
    if not layout.colocated and lay.engine_gpus and lay.engine_gpus != layout.engine_gpus:
        bad(
            "layout.engine_gpus",
            f"but engine_tp x engine_count = {layout.engine_gpus}; make them agree (or leave it 0)",
        )

    # ---- batch ----
    samples = data.prompts_per_step * ro.samples_per_prompt
    if ro.samples_per_prompt < 2 and alg.name == "grpo":
        bad("rollout.samples_per_prompt", "GRPO needs >= 2 samples per prompt (group-relative advantages)")
    if samples % alg.minibatches:
        bad(
            "algorithm.minibatches",
            f"must divide the {samples} samples per step (data.prompts_per_step x rollout.samples_per_prompt)",
        )
    else:
        per_mb = samples // alg.minibatches
        unit = lay.dp * opt.micro_batch_size
        if per_mb % unit:
            bad(
                "optim.micro_batch_size",
                f"each minibatch of {per_mb} samples must split evenly over "
                f"layout.dp={lay.dp} ranks x micro_batch_size={opt.micro_batch_size}",
            )

    # ---- lengths ----
    if data.max_prompt_tokens + ro.max_new_tokens > m.max_position_embeddings:
        bad(
            "rollout.max_new_tokens",
            f"data.max_prompt_tokens ({data.max_prompt_tokens}) + max_new_tokens "
            f"exceeds model.max_position_embeddings={m.max_position_embeddings}",
        )
    if ro.mean_completion_tokens > ro.max_new_tokens:
        bad(
            "rollout.mean_completion_tokens",
            f"exceeds rollout.max_new_tokens={ro.max_new_tokens}: the mean cannot be above the cap",
        )
    if data.prompt_tokens > data.max_prompt_tokens:
        bad("data.prompt_tokens", f"exceeds data.max_prompt_tokens={data.max_prompt_tokens}")
    if opt.lr / (1 - opt.adam_beta1) > FLOAT32_MAX:
        bad("optim.lr", f"Adam's first step size lr / (1 - adam_beta1) overflows float32 ({FLOAT32_MAX:.2e})")
    if opt.min_lr > opt.lr:
        bad("optim.min_lr", f"exceeds optim.lr={opt.lr}")
    if any(t >= m.vocab_size for t in ro.stop_token_ids):
        bad("rollout.stop_token_ids", f"every id must be below model.vocab_size={m.vocab_size}")

    # ---- sampling convention (rollout/convention.py; its ranges were checked above) ----
    full_vocab = None if convention else full_vocab_problem(ro.logprobs_mode, ro.top_p, ro.top_k)
    if full_vocab:
        out.append(full_vocab)

    # ---- reward, cluster, publication ----
    if cfg.reward.kind == "function" and not re.fullmatch(r"[\w.]+:\w+", cfg.reward.function):
        bad("reward.function", "must name a module:function for reward.kind=function")
    if cl.time_limit and not SLURM_TIME.match(cl.time_limit):
        bad("cluster.time_limit", "is not a Slurm time; use e.g. 48:00:00, 2-00:00:00 or 90 (minutes)")
    # `skip` samples with the previous version after a refusal; a level-2 sleep has discarded it by then
    level = sleep_level_for(ro.sleep_level, delivery_for(on_gpu=cl.gpu != "cpu"))
    if ro.on_refused_publication == "skip" and level == 2:
        bad(
            "rollout.on_refused_publication",
            "skip samples with the previous version after a refusal, but at sleep level 2 (the GPU default "
            "with in-place delivery) the engines discard its weights while training; set "
            "rollout.sleep_level=1 (weights kept on the host) or use stop/retry",
        )

    out += file_problems(cfg)
    if not [p for p in out if p.kind in ("recipe", "driver")]:
        out += memory_problems(cfg, layout)
    return out


def file_problems(cfg: RecipeConfig) -> list[Problem]:
    """Paths the recipe names that cannot be read from this machine."""
    out = []
    ckpt = cfg.model.hf_checkpoint
    if ckpt and not (Path(ckpt) / "config.json").is_file():
        out.append(
            Problem(
                "model.hf_checkpoint",
                ckpt,
                "holds no config.json (an HF model directory is expected)",
                "files",
            )
        )
    source = cfg.data.source
    if source not in ("bundled", "synthetic") and not Path(source).exists():
        out.append(
            Problem(
                "data.source", source, "is neither bundled, synthetic nor an existing file or folder", "files"
            )
        )
    return out


def memory_problems(cfg: RecipeConfig, layout: ParallelLayout) -> list[Problem]:
    """Memory fit from the planner's model (skipped for the CPU cluster, whose 'GPU' is host RAM)."""
    if cfg.cluster.gpu == "cpu":
        return []
    from megatron_rl.plan.memory import memory_per_gpu

    mem = memory_per_gpu(cfg)
    cap = cfg.cluster.gpu_memory_gib
    trainer, engine = mem["trainer_per_gpu"], mem["engine_per_gpu"]
    # Colocated: the engine sleeps while the trainer trains, so each must fit on its own.
    worst = max(trainer, engine) if layout.colocated else trainer
    if worst > cap:
        return [
            Problem(
                "layout.tp",
                cfg.layout.tp,
                f"predicted memory {worst:.1f} GiB per GPU (trainer {trainer:.1f}, engine {engine:.1f}) exceeds "
                f"cluster.gpu_memory_gib={cap}; raise tp/pp, use layout.recompute=full, or more GPUs "
                "(`megatron-rl plan` shows the breakdown)",
                "memory",
            )
        ]
    # Colocated: vLLM claims gpu_memory_utilization x the GPU at construction, beside the trainer's params.
    util = cfg.rollout.gpu_memory_utilization
    kept = mem["trainer"]["resident_at_engine_construction"]
    if layout.colocated and kept + util * cap > cap:
        return [
            Problem(
                "rollout.gpu_memory_utilization",
                util,
                f"building the engine claims {util} x {cap} GiB while the trainer keeps {kept:.1f} GiB of "
                f"params per GPU: {kept + util * cap:.1f} GiB > {cap} GiB; lower it to at most "
                f"{(cap - kept) / cap:.2f} or raise layout.tp/pp",
                "memory",
            )
        ]
    return []


# Which kinds each command refuses (the rest it may print as notes).
REFUSES = {
    "run": ("recipe", "driver", "memory", "files"),  # the driver, before building anything
    "validate": ("recipe", "driver", "memory"),  # files on the cluster's storage may be unreadable here
    "plan": ("recipe",),  # the planner models future layouts and shows memory that does not fit
}


def refused(problems: list[Problem], purpose: str) -> list[Problem]:
    return [p for p in problems if p.kind in REFUSES[purpose]]


def notes(problems: list[Problem], purpose: str) -> list[str]:
    """One line per problem this command lets through, so nothing is silently skipped."""
    out = []
    for p in problems:
        if p.kind not in REFUSES[purpose]:
            if p.kind == "files":
                out.append(f"not checked here: {p}; the driver checks it before building anything")
            else:
                out.append(f"note: {p}")
    return out


def validate_recipe(cfg: RecipeConfig, purpose: str = "run") -> RecipeConfig:
    """Raise ConfigError listing every problem `purpose` refuses; return the recipe when none."""
    problems = refused(check_recipe(cfg), purpose)
    if problems:
        raise ConfigError(problems, getattr(cfg, "name", ""))
    return cfg
