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
from dataclasses import replace
from pathlib import Path

from megatron_rl.config.choices import (
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
from megatron_rl.config.problem import ConfigError, Problem
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.layout import ParallelLayout
from megatron_rl.models.dtypes import RECIPE_DTYPES
from megatron_rl.models.resolve import (
    CheckpointConfigError,
    disagreements,
    model_problems,
    resolve_model,
    tokenizer_problems,
)
from megatron_rl.rollout.convention import convention_problems, full_vocab_problem
from megatron_rl.rollout.delivery import SLEEP_LEVELS, delivery_for, sleep_level_for

MIN_DIST_TIMEOUT_S = 60.0
MAX_PROMPTS_CHECKED = 20_000  # prompts `validate` tokenizes to check their length
FLOAT32_MAX = 3.4028234663852886e38
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or no limit).
SLURM_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")

ENUMS = {
    "model.family": FAMILIES,
    "model.params_dtype": RECIPE_DTYPES,
    "model.fixture": ("", "qwen2", "qwen3", "llama"),
    "algorithm.name": ("grpo",),
    "algorithm.kl_estimator": KL_ESTIMATORS,
    "algorithm.loss_agg": LOSS_AGGREGATIONS,
    "algorithm.overlong": OVERLONG_MODES,
    "algorithm.reference": REFERENCE_PLACEMENTS,
    "algorithm.old_logprobs": OLD_LOGPROBS,
    "rollout.engine": ("vllm",),
    "rollout.on_refused_publication": REFUSAL_POLICIES,
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
OVERSAMPLE_MAX = 4.0
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
    "model.rope_scaling_factor": GE1,
    "model.rope_low_freq_factor": GT0,
    "model.rope_high_freq_factor": GT0,
    "model.rope_original_max_position": GE0,
    "model.norm_eps": (0, 1, False, False),
    **{f"layout.{k}": GE1 for k in ("tp", "pp", "dp", "cp", "ep", "engine_tp", "engine_count")},
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
    "rollout.logprob_check_threshold": GT0,
    "rollout.max_refused_publications": GE1,
    "rollout.max_staleness": GE0,
    "rollout.oversample": GE1,
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


def _get(cfg, dotted: str):
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
        value = _get(cfg, key)
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


def check_recipe(cfg: RecipeConfig, read_data: bool = True) -> list[Problem]:
    """Every problem of a recipe, of every kind (empty list = it can run).

    `read_data` also reads the problem set through the model's tokenizer (when both are readable
    here) to find prompts longer than data.max_prompt_tokens; the planner skips it."""
    out: list[Problem] = []

    def bad(key: str, message: str, kind: str = "recipe") -> None:
        out.append(Problem(key, _get(cfg, key), message, kind))

    # The model the recipe means: unset keys from its checkpoint's config.json, which set keys must
    # agree with (models/resolve.py); everything below checks that resolved model.
    try:
        model = resolve_model(cfg.model)
    except CheckpointConfigError as e:
        return [Problem("model.hf_checkpoint", cfg.model.hf_checkpoint, str(e))]
    out += disagreements(cfg.model)
    out += model_problems(model)
    out += tokenizer_problems(model)
    out += stop_id_problems(model)
    if out:
        return out + file_problems(cfg)  # no shape to check the layout, lengths or memory against
    cfg = replace(cfg, model=model)

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
    if not re.fullmatch(r"(?!\.+$)[\w.+-]{1,128}", cfg.name):
        bad("name", "must be 1-128 letters, digits or . _ + -, not only dots (it names the run's folders)")
    if not m.name.strip():
        bad("model.name", "must not be empty")

    # ---- model shape ----
    if m.num_attention_heads % m.num_query_groups:
        bad("model.num_query_groups", f"must divide model.num_attention_heads={m.num_attention_heads}")
    if m.rope_scaling == "llama3":
        if m.rope_high_freq_factor <= m.rope_low_freq_factor:
            bad(
                "model.rope_high_freq_factor",
                f"must exceed model.rope_low_freq_factor={m.rope_low_freq_factor}",
            )
        if m.rope_original_max_position < 1:
            bad("model.rope_original_max_position", "must be >= 1 (the context the model was pre-trained at)")
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        bad(
            "model.hidden_size",
            f"is not a multiple of num_attention_heads={m.num_attention_heads}; set model.head_dim",
        )

    # ---- layout vs model and cluster ----
    layout = ParallelLayout.from_config(cfg.layout)
    out += layout.check(m, cl)
    lay = cfg.layout

    # The capped importance weight pi_old / pi_engine is 1 when the old log-probs are the engines' own.
    if alg.old_logprobs == "engine" and alg.truncated_is_cap > 0:
        bad(
            "algorithm.truncated_is_cap",
            "corrects the trainer's old log-probs toward the engines'; with algorithm.old_logprobs=engine "
            "they are the engines' own and every weight is 1: set truncated_is_cap=0, or old_logprobs=auto",
        )

    # The engines meet the trainer once a step (loop/schedule.py) and draw one batch per meeting: more than
    # one batch ahead would add staleness and no overlap.
    if lay.synchrony == "async" and ro.max_staleness != 1:
        bad(
            "rollout.max_staleness",
            "must be 1 with layout.synchrony=async: the engines draw one batch per step, between two "
            "publications, so running further ahead adds lag without more overlap",
        )
    # Over-sampling: every engine draws ceil(its share x f); a factor that adds no prompt to an engine
    # does nothing there, and a huge one would queue that many requests.
    if ro.oversample > 1:
        share = data.prompts_per_step // max(lay.engine_count, 1)
        if ro.oversample > OVERSAMPLE_MAX:
            bad(
                "rollout.oversample",
                f"must be <= {OVERSAMPLE_MAX} (each engine draws that many times its prompts)",
            )
        elif share == 0:
            bad(
                "rollout.oversample",
                f"needs a prompt per engine to over-sample: {data.prompts_per_step} prompts per step over "
                f"{lay.engine_count} engines; raise data.prompts_per_step, or set rollout.oversample=1",
            )
        elif math.ceil(share * ro.oversample - 1e-9) == share:
            bad(
                "rollout.oversample",
                f"adds no prompt to an engine with {share} of the {data.prompts_per_step} prompts per step "
                f"({lay.engine_count} engines): use at least {(share + 1) / share:.3g}, or 1 to turn it off",
            )
    # Asynchronous batches come from an older policy than the one trained: the loss must correct for it.
    if lay.synchrony == "async" and alg.truncated_is_cap <= 0 and alg.old_logprobs != "engine":
        bad(
            "algorithm.truncated_is_cap",
            f"is 0 with layout.synchrony=async: batches are sampled up to rollout.max_staleness="
            f"{ro.max_staleness} updates before they are trained, and without a correction the loss treats "
            "them as on-policy. Set algorithm.truncated_is_cap (e.g. 2.0: truncated importance sampling "
            "against the engines' log-probs), or algorithm.old_logprobs=engine",
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

    # Problem prompts are tokenized with the model's own tokenizer and chat template.
    if data.source != "synthetic" and not m.hf_checkpoint:
        bad(
            "data.source",
            "needs the model's tokenizer: set model.hf_checkpoint (or use data.source=synthetic)",
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
    if opt.lr_schedule == "cosine" and opt.warmup_steps >= cfg.steps:
        bad(
            "optim.warmup_steps",
            f"leaves nothing of the {cfg.steps} steps to decay over (lr_schedule=cosine)",
        )
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
    if not SLURM_TIME.match(cl.time_limit):
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
    if read_data and not out and data.source != "synthetic":
        out += prompt_problems(cfg)
    return out


def prompt_problems(cfg: RecipeConfig) -> list[Problem]:
    """The problem set as the driver will read it, through the model's tokenizer and chat template:
    a malformed record, or a prompt longer than data.max_prompt_tokens (which would fail when drawn,
    hours into a run), is refused here. Needs transformers: only reached with readable files."""
    from transformers import AutoTokenizer

    from megatron_rl.data.task import ProblemTask

    d, ckpt = cfg.data, cfg.model.hf_checkpoint
    try:
        tok = AutoTokenizer.from_pretrained(ckpt)
    except Exception as e:  # OSError, ValueError, huggingface_hub's validation errors: any is a refusal
        return [Problem("model.hf_checkpoint", ckpt, f"holds no tokenizer transformers can load: {e}")]
    try:
        task = ProblemTask.from_config(cfg, tok)
    except (ValueError, OSError) as e:
        return [Problem("data.source", d.source, f"cannot be read as problems: {e}")]
    cap = cfg.data.max_prompt_tokens
    try:
        sizes = [(len(task.encode_prompt(p.prompt)), p.id) for p in task.problems[:MAX_PROMPTS_CHECKED]]
    except Exception as e:  # the chat template raised (jinja's TemplateError), or refused a system message
        key = "data.system_prompt" if d.system_prompt else "model.hf_checkpoint"
        value = d.system_prompt if d.system_prompt else ckpt
        return [Problem(key, value, f"the tokenizer's chat template fails on the prompts: {e}")]
    long = sorted((n, pid) for n, pid in sizes if n > cap)
    if not long:
        return []
    n, pid = long[-1]
    return [
        Problem(
            "data.max_prompt_tokens",
            cap,
            f"{len(long)} of {len(sizes)} prompts are longer (the longest: problem {pid!r}, {n} tokens with "
            "the chat template); raise it or drop those problems",
        )
    ]


def stop_id_problems(model) -> list[Problem]:
    """The end ids the engines will stop at, read from the checkpoint as the driver reads them: a file
    that does not parse, or an id past the vocabulary, is refused here rather than when engines start."""
    if not model.hf_checkpoint or not (Path(model.hf_checkpoint) / "config.json").is_file():
        return []
    from megatron_rl.models.checkpoint import stop_token_ids

    try:
        ids = stop_token_ids(model.hf_checkpoint)
    except (ValueError, OSError) as e:
        return [
            Problem("model.hf_checkpoint", model.hf_checkpoint, f"its end-of-sequence ids do not read: {e}")
        ]
    past = [i for i in ids if model.vocab_size is not None and i >= model.vocab_size]
    if past:
        return [
            Problem(
                "model.hf_checkpoint",
                model.hf_checkpoint,
                f"names end ids {past} at or past model.vocab_size={model.vocab_size}",
            )
        ]
    return []


def file_problems(cfg: RecipeConfig) -> list[Problem]:
    """Paths the recipe names that cannot be read from this machine."""
    out = []
    ckpt = cfg.model.hf_checkpoint
    if ckpt and not (Path(ckpt) / "config.json").is_file() and cfg.model.num_layers is not None:
        out.append(
            Problem(
                "model.hf_checkpoint",
                ckpt,
                "holds no config.json (an HF model directory is expected)",
                "files",
            )
        )
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "none") and not Path(resume).expanduser().is_dir():
        out.append(
            Problem(
                "checkpoint.resume",
                resume,
                "is neither auto, none nor an existing checkpoint folder (a step folder or a run's folder of them)",
                "files",
            )
        )
    for key in ("logger.run_dir", "checkpoint.dir"):
        where = Path(_get(cfg, key)).expanduser()
        blocked = next((p for p in (where, *where.parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            out.append(Problem(key, str(where), f"cannot be a folder: {blocked} is a file", "files"))
    if cfg.reward.kind == "function" and re.fullmatch(r"[\w.]+:\w+", cfg.reward.function):
        import importlib.util

        module = cfg.reward.function.split(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(
                Problem(
                    "reward.function",
                    cfg.reward.function,
                    f"module {module!r} is not importable here",
                    "files",
                )
            )
    source = cfg.data.source
    if source != "synthetic":
        from megatron_rl.data.sources import source_problem

        why = source_problem(source)
        if why:
            out.append(Problem("data.source", source, why, "files"))
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
    "run": ("recipe", "driver", "memory", "files", "unknown"),  # the driver, before building anything
    "validate": ("recipe", "driver", "memory"),  # files on the cluster's storage may be unreadable here
    # The planner models future layouts and shows memory that does not fit, but needs the model's shape.
    "plan": ("recipe", "unknown"),
}


def refused(problems: list[Problem], purpose: str) -> list[Problem]:
    return [p for p in problems if p.kind in REFUSES[purpose]]


def notes(problems: list[Problem], purpose: str) -> list[str]:
    """One line per problem this command lets through, so nothing is silently skipped."""
    out = []
    for p in problems:
        if p.kind not in REFUSES[purpose]:
            if p.kind in ("files", "unknown"):
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
