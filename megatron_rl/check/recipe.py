"""The one check of a recipe: whatever the driver would refuse, every command refuses first.

`validate`, `submit`, `launch_local`, the planner and the driver (`train.py`, before it builds
anything) call `check_recipe`; each refuses the kinds of problem that concern it
(config/problem.py): the planner skips layouts the driver cannot run yet and memory it will show
anyway; `validate` and `submit` note paths they cannot read from this machine, which the driver
then refuses on the cluster.

Hydra's structured configs refuse unknown keys and wrong types. This module adds what they cannot
see: every number's range and the enumerations (check/ranges.py), paths, end ids and prompt lengths
read from this machine (check/files.py), and here the rules between keys: the layout against
the model and the cluster (`ParallelLayout.check`), batch and length arithmetic, the sampling
convention, publication settings and the memory fit. All problems are collected, so a user fixes a
recipe in one pass. It sits above `config/`, `parallel/layout.py` and `plan/` (it asks the planner for the
memory fit), and nothing below imports it.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from megatron_rl.check.files import file_problems, prompt_problems, stop_id_problems
from megatron_rl.check.ranges import ENUMS, NUMERIC, get_key, numeric_problems
from megatron_rl.config.problem import ConfigError, Problem
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.models.resolve import (
    CheckpointConfigError,
    disagreements,
    model_problems,
    resolve_model,
    tokenizer_problems,
)
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.rollout.agreement import agreement_problems
from megatron_rl.rollout.convention import convention_problems, full_vocab_problem
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for

FLOAT32_MAX = 3.4028234663852886e38
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or no limit).
SLURM_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
OVERSAMPLE_MAX = 4.0  # rollout.oversample: each engine draws at most this many times its prompts


def check_recipe(cfg: RecipeConfig, read_data: bool = True) -> list[Problem]:
    """Every problem of a recipe, of every kind (empty list = it can run).

    `read_data` also reads the problem set through the model's tokenizer (when both are readable
    here) to find prompts longer than data.max_prompt_tokens; the planner skips it."""
    out: list[Problem] = []

    def bad(key: str, message: str, kind: str = "recipe") -> None:
        out.append(Problem(key, get_key(cfg, key), message, kind))

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
        if get_key(cfg, key) not in allowed:
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

    # The engines meet the trainer once a step (parallel/schedule.py) and draw one batch per meeting: more than
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
    # Partial rollouts cut what still runs once the first groups are done: with nothing in flight beyond
    # the batch, every group must finish and nothing is ever cut.
    if ro.partial and ro.oversample <= 1:
        bad(
            "rollout.partial",
            "cuts the groups still running once the batch's groups have finished, and with "
            "rollout.oversample=1 every group in flight is needed: set rollout.oversample > 1 (e.g. 1.5: "
            "1.5 x the prompts in flight, the first prompts_per_step to finish train), or rollout.partial=false",
        )
    # Each batch cuts up to (f - 1) x what it trains; above f = 2 the groups cut max_cuts times can outnumber
    # an engine's quota, and those that do not fit would be cut again (the lag bound would not hold).
    if ro.partial and ro.oversample > 2:
        bad(
            "rollout.oversample",
            "must be <= 2 with rollout.partial=true: a batch would cut more groups than it trains, and the "
            "groups cut rollout.partial_max_cuts times, which the next batch must wait for, could outnumber "
            "its quota",
        )
    if alg.routing_replay and m.family != "qwen3_moe":
        bad(
            "algorithm.routing_replay",
            f"replays the experts the engine routed each token to; model.family={m.family} has no experts",
        )
    if alg.routing_replay and ro.partial:
        bad(
            "algorithm.routing_replay",
            "does not combine with rollout.partial yet: a continued sample's earlier tokens were routed under "
            "an older version; set rollout.partial=false",
        )
    if alg.routing_replay and cfg.layout.recompute == "full" and cfg.layout.pp > 1:
        bad(
            "algorithm.routing_replay",
            "does not combine with layout.recompute=full at layout.pp > 1 yet: the recomputed forward in a "
            "microbatch's backward would replay the routes of a later microbatch (1F1B runs several "
            "forwards first); use layout.recompute=selective or none",
        )
    if alg.routing_replay and (m.num_experts or 0) > 255:
        bad(
            "algorithm.routing_replay",
            f"carries expert ids as bytes: at most 255 experts, not {m.num_experts}",
        )
    if ro.partial and alg.dynamic_sampling:
        bad(
            "rollout.partial",
            "does not combine with algorithm.dynamic_sampling yet (a resampling round would continue "
            "another round's cut groups); turn one of them off",
        )
    if ro.partial and alg.truncated_is_cap <= 0 and alg.old_logprobs != "engine":
        bad(
            "algorithm.truncated_is_cap",
            "is 0 with rollout.partial=true: a continued sample holds tokens drawn up to "
            f"rollout.partial_max_cuts={ro.partial_max_cuts} versions before the one trained, and without a "
            "correction the loss treats them as on-policy. Set algorithm.truncated_is_cap (e.g. 2.0), or "
            "algorithm.old_logprobs=engine",
        )
    if data.tail_share > 0 and data.source != "synthetic":
        bad("data.tail_share", "shapes the synthetic task's answer lengths: set data.source=synthetic, or 0")
    if data.tail_share > 0 and data.short_answer_tokens >= ro.max_new_tokens:
        bad(
            "data.short_answer_tokens",
            f"must be below rollout.max_new_tokens={ro.max_new_tokens} with data.tail_share > 0, or no "
            "answer is shorter than the long ones",
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

    out += agreement_problems(cfg)  # thresholds for the dtype pair, the probe's length

    if cl.gpu == "cpu" and cfg.layout.engine_ep:
        bad(
            "layout.engine_ep", "is for GPU engines (vLLM's CPU MoE engine runs at engine TP 1); set it false"
        )
    if cl.gpu == "cpu" and (m.num_experts or 0) and cfg.layout.engine_tp > 1:
        bad(
            "layout.engine_tp",
            "must be 1 for a mixture-of-experts model on the CPU build: after each publication the engine "
            "repacks the experts vLLM's CPU reload leaves raw (rollout/moe_reload.py), which is built and "
            "tested for whole experts per engine; use layout.engine_count for more engines",
        )
    if cl.gpu == "cpu" and cfg.layout.sequence_parallel and cfg.layout.tp > 1:
        bad(
            "layout.sequence_parallel",
            "is not available on the CPU build: megatron-core's local layer spec (torch norms, no "
            "transformer-engine) refuses sequence parallelism; set it false, and for a mixture-of-experts "
            "model (which needs it at TP > 1) use layout.tp=1 with layout.ep / layout.etp on CPU",
        )

    out += file_problems(cfg)
    if not [p for p in out if p.kind in ("recipe", "driver")]:
        out += memory_problems(cfg, layout)
    if read_data and not out and data.source != "synthetic":
        out += prompt_problems(cfg)
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
