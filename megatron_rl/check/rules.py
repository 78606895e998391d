"""The rules between a recipe's keys, one small function per group, each naming the key it refuses.

Each rule takes the resolved run (run/resolve.py: the recipe with its model read from the checkpoint,
the layout, the spec, the sleep level...) once every number is in its range (check/ranges.py), and
returns its problems. `RULES` is the order they run in; check/recipe.py runs them all, so a user fixes a
recipe in one pass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from megatron_rl.check.ppo import ppo, reward_model
from megatron_rl.check.ranges import get_key
from megatron_rl.check.turns import environment
from megatron_rl.config.problem import Problem
from megatron_rl.rollout.agreement import agreement_problems
from megatron_rl.rollout.convention import full_vocab_problem
from megatron_rl.rollout.engine_rules import engine_problems

FLOAT32_MAX = 3.4028234663852886e38
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or no limit).
SLURM_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
OVERSAMPLE_MAX = 4.0  # rollout.oversample: each engine draws at most this many times its prompts


def _problem(run, key: str, message: str, kind: str = "recipe") -> Problem:
    return Problem(key, get_key(run.recipe, key), message, kind)


def names(run) -> list[Problem]:
    """The run's folders and W&B group are named after the recipe."""
    cfg, out = run.recipe, []
    if not re.fullmatch(r"(?!\.+$)[\w.+-]{1,128}", cfg.name):
        out.append(
            _problem(
                run,
                "name",
                "must be 1-128 letters, digits or . _ + -, not only dots (it names the run's folders)",
            )
        )
    if not cfg.model.name.strip():
        out.append(_problem(run, "model.name", "must not be empty"))
    return out


def model_shape(run) -> list[Problem]:
    m, out = run.recipe.model, []
    if m.num_attention_heads % m.num_query_groups:
        out.append(
            _problem(
                run,
                "model.num_query_groups",
                f"must divide model.num_attention_heads={m.num_attention_heads}",
            )
        )
    if m.rope_scaling == "llama3":
        if m.rope_high_freq_factor <= m.rope_low_freq_factor:
            out.append(
                _problem(
                    run,
                    "model.rope_high_freq_factor",
                    f"must exceed model.rope_low_freq_factor={m.rope_low_freq_factor}",
                )
            )
        if m.rope_original_max_position < 1:
            out.append(
                _problem(
                    run,
                    "model.rope_original_max_position",
                    "must be >= 1 (the context the model was pre-trained at)",
                )
            )
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        out.append(
            _problem(
                run,
                "model.hidden_size",
                f"is not a multiple of num_attention_heads={m.num_attention_heads}; set model.head_dim",
            )
        )
    return out


def layout(run) -> list[Problem]:
    """The layout against the model and the cluster (the layout's own rules, parallel/rules.py), and the
    features the CPU build's trainer lacks."""
    cfg = run.recipe
    out = run.layout.check(cfg.model, cfg.cluster)
    if not run.on_gpu and run.layout.sequence_parallel and run.layout.tp > 1:
        out.append(
            _problem(
                run,
                "layout.sequence_parallel",
                "is not available on the CPU build: megatron-core's local layer spec (torch norms, no "
                "transformer-engine) refuses sequence parallelism; set it false, and for a mixture-of-experts "
                "model (which needs it at TP > 1) use layout.tp=1 with layout.ep / layout.etp on CPU",
            )
        )
    return out


def off_policy(run) -> list[Problem]:
    """Asynchrony, over-sampling and partial rollouts, and the corrections they need."""
    cfg, out = run.recipe, []
    alg, ro, data, lay = cfg.algorithm, cfg.rollout, cfg.data, run.layout

    def bad(key: str, message: str) -> None:
        out.append(_problem(run, key, message))

    # The capped importance weight pi_old / pi_engine is 1 when the old log-probs are the engines' own.
    if alg.old_logprobs == "engine" and alg.truncated_is_cap > 0:
        bad(
            "algorithm.truncated_is_cap",
            "corrects the trainer's old log-probs toward the engines'; with algorithm.old_logprobs=engine "
            "they are the engines' own and every weight is 1: set truncated_is_cap=0, or old_logprobs=auto",
        )
    # The engines meet the trainer once a step (parallel/schedule.py) and draw one batch per meeting: more
    # than one batch ahead would add staleness and no overlap.
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
    # Asynchronous batches come from an older policy than the one trained: the loss must correct for it.
    if lay.synchrony == "async" and alg.truncated_is_cap <= 0 and alg.old_logprobs != "engine":
        bad(
            "algorithm.truncated_is_cap",
            f"is 0 with layout.synchrony=async: batches are sampled up to rollout.max_staleness="
            f"{ro.max_staleness} updates before they are trained, and without a correction the loss treats "
            "them as on-policy. Set algorithm.truncated_is_cap (e.g. 2.0: truncated importance sampling "
            "against the engines' log-probs), or algorithm.old_logprobs=engine",
        )
    return out


def routing_replay(run) -> list[Problem]:
    cfg, out = run.recipe, []
    if not cfg.algorithm.routing_replay:
        return out
    if cfg.rollout.partial:
        out.append(
            _problem(
                run,
                "algorithm.routing_replay",
                "does not combine with rollout.partial yet: a continued sample's earlier tokens were routed under "
                "an older version; set rollout.partial=false",
            )
        )
    if run.layout.recompute == "full" and run.layout.pp > 1:
        out.append(
            _problem(
                run,
                "algorithm.routing_replay",
                "does not combine with layout.recompute=full at layout.pp > 1 yet: the recomputed forward in a "
                "microbatch's backward would replay the routes of a later microbatch (1F1B runs several "
                "forwards first); use layout.recompute=selective or none",
            )
        )
    if (cfg.model.num_experts or 0) > 255:
        out.append(
            _problem(
                run,
                "algorithm.routing_replay",
                f"carries expert ids as bytes: at most 255 experts, not {cfg.model.num_experts}",
            )
        )
    return out


def data(run) -> list[Problem]:
    cfg, out = run.recipe, []
    d, ro = cfg.data, cfg.rollout
    if d.tail_share > 0 and d.source != "synthetic":
        out.append(
            _problem(
                run,
                "data.tail_share",
                "shapes the synthetic task's answer lengths: set data.source=synthetic, or 0",
            )
        )
    if d.tail_share > 0 and d.short_answer_tokens >= ro.max_new_tokens:
        out.append(
            _problem(
                run,
                "data.short_answer_tokens",
                f"must be below rollout.max_new_tokens={ro.max_new_tokens} with data.tail_share > 0, or no "
                "answer is shorter than the long ones",
            )
        )
    # Problem prompts are tokenized with the model's own tokenizer and chat template.
    if d.source != "synthetic" and not cfg.model.hf_checkpoint:
        out.append(
            _problem(
                run,
                "data.source",
                "needs the model's tokenizer: set model.hf_checkpoint (or use data.source=synthetic)",
            )
        )
    return out


def batch(run) -> list[Problem]:
    """A step's samples split into minibatches, each over the DP ranks in micro-batches: one equation of
    five keys, so the refusal names all five and the values of each that would fit."""
    cfg, out = run.recipe, []
    alg, ro, d = cfg.algorithm, cfg.rollout, cfg.data
    if ro.samples_per_prompt < 2 and alg.name == "grpo":
        out.append(
            _problem(
                run,
                "rollout.samples_per_prompt",
                "GRPO needs >= 2 samples per prompt (group-relative advantages)",
            )
        )
    p, s, m, dp, mbs = (
        d.prompts_per_step,
        ro.samples_per_prompt,
        alg.minibatches,
        run.layout.dp,
        cfg.optim.micro_batch_size,
    )
    samples = p * s
    if samples % (m * dp * mbs) == 0:
        return out
    if samples % m:
        key, what = "algorithm.minibatches", f"must divide the {samples} samples per step"
    elif samples // m % dp:
        n = samples // m
        key, what = (
            "optim.micro_batch_size",
            f"cannot fit: a minibatch of {n} sample{'s' * (n != 1)} does not split over layout.dp={dp} ranks",
        )
    else:
        key, what = (
            "optim.micro_batch_size",
            f"must divide each rank's {samples // m // dp} samples of a minibatch",
        )
    each = f" of {samples // m}" if samples % m == 0 else ""
    out.append(
        _problem(
            run,
            key,
            f"{what}. The batch: data.prompts_per_step={p} x rollout.samples_per_prompt={s} = {samples} samples "
            f"per step, in algorithm.minibatches={m} minibatches{each}, each over layout.dp={dp} ranks in "
            f"micro-batches of optim.micro_batch_size={mbs}: {samples} must be a multiple of {m} x {dp} x "
            f"{mbs} = {m * dp * mbs}. {_batch_fixes(p, s, m, dp, mbs)}",
        )
    )
    return out


def _batch_fixes(p: int, s: int, m: int, dp: int, mbs: int) -> str:
    """The nearest values of each key but layout.dp (the world size sets it) that fit, the others kept."""
    samples, need = p * s, m * dp * mbs
    fixes = []
    if samples % (m * dp) == 0:
        fixes.append(("optim.micro_batch_size", _nearest(_divisors(samples // (m * dp)), mbs)))
    if samples % (dp * mbs) == 0:
        fixes.append(("algorithm.minibatches", _nearest(_divisors(samples // (dp * mbs)), m)))
    for key, mine, other, low in (
        ("data.prompts_per_step", p, s, 1),
        ("rollout.samples_per_prompt", s, p, 2),
    ):
        step = need // math.gcd(need, other)  # mine x other is a multiple of need iff mine is one of step
        fixes.append(
            (key, _nearest([v for v in (mine // step * step, mine // step * step + step) if v >= low], mine))
        )
    listed = "; ".join(f"{key}={' or '.join(map(str, values))}" for key, values in fixes if values)
    return f"Values that fit, one key changed: {listed}"


def _divisors(n: int) -> list[int]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def _nearest(values: list[int], current: int) -> list[int]:
    """The largest of `values` below `current` and the smallest above it (those that exist)."""
    below = [v for v in values if v < current]
    above = [v for v in values if v > current]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def lengths(run) -> list[Problem]:
    cfg, out = run.recipe, []
    m, d, ro = cfg.model, cfg.data, cfg.rollout
    if d.max_prompt_tokens + ro.max_new_tokens > m.max_position_embeddings:
        out.append(
            _problem(
                run,
                "rollout.max_new_tokens",
                f"data.max_prompt_tokens ({d.max_prompt_tokens}) + max_new_tokens exceeds "
                f"model.max_position_embeddings={m.max_position_embeddings}",
            )
        )
    if ro.mean_completion_tokens > ro.max_new_tokens:
        out.append(
            _problem(
                run,
                "rollout.mean_completion_tokens",
                f"exceeds rollout.max_new_tokens={ro.max_new_tokens}: the mean cannot be above the cap",
            )
        )
    if d.prompt_tokens > d.max_prompt_tokens:
        out.append(
            _problem(run, "data.prompt_tokens", f"exceeds data.max_prompt_tokens={d.max_prompt_tokens}")
        )
    if any(t >= m.vocab_size for t in ro.stop_token_ids):
        out.append(
            _problem(run, "rollout.stop_token_ids", f"every id must be below model.vocab_size={m.vocab_size}")
        )
    return out


def optim(run) -> list[Problem]:
    cfg, out = run.recipe, []
    opt = cfg.optim
    if opt.lr / (1 - opt.adam_beta1) > FLOAT32_MAX:
        out.append(
            _problem(
                run,
                "optim.lr",
                f"Adam's first step size lr / (1 - adam_beta1) overflows float32 ({FLOAT32_MAX:.2e})",
            )
        )
    if opt.lr_schedule == "cosine" and opt.warmup_steps >= cfg.steps:
        out.append(
            _problem(
                run,
                "optim.warmup_steps",
                f"leaves nothing of the {cfg.steps} steps to decay over (lr_schedule=cosine)",
            )
        )
    if opt.min_lr > opt.lr:
        out.append(_problem(run, "optim.min_lr", f"exceeds optim.lr={opt.lr}"))
    return out


def sampling(run) -> list[Problem]:
    """The sampling convention's truncated support the trainer cannot follow (rollout/convention.py; its
    ranges were checked with the numbers)."""
    ro = run.recipe.rollout
    full_vocab = full_vocab_problem(ro.logprobs_mode, ro.top_p, ro.top_k)
    return [full_vocab] if full_vocab else []


def reward_and_cluster(run) -> list[Problem]:
    cfg, out = run.recipe, []
    if cfg.reward.kind == "function" and not re.fullmatch(r"[\w.]+:\w+", cfg.reward.function):
        out.append(_problem(run, "reward.function", "must name a module:function for reward.kind=function"))
    out += _remote_reward(run)
    if not SLURM_TIME.match(cfg.cluster.time_limit):
        out.append(
            _problem(
                run,
                "cluster.time_limit",
                "is not a Slurm time; use e.g. 48:00:00, 2-00:00:00 or 90 (minutes)",
            )
        )
    return out


def _remote_reward(run) -> list[Problem]:
    """The reward fleet and HTTP judges (reward/remote.py): what they are told must be usable."""
    r, out = run.recipe.reward, []
    if r.endpoints and r.endpoints_file:
        out.append(
            _problem(run, "reward.endpoints", "and reward.endpoints_file are both set: give one of them")
        )
    for e in r.endpoints:
        host, _, port = str(e).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            out.append(_problem(run, "reward.endpoints", f"holds {e!r}, which is not host:port"))
    if (r.endpoints or r.endpoints_file) and r.kind not in ("sandbox", "function"):
        out.append(
            _problem(
                run,
                "reward.endpoints",
                f"serve reward.kind=sandbox or function; this recipe has kind={r.kind}",
            )
        )
    if r.fleet_nodes and r.kind not in ("sandbox", "function"):
        out.append(
            _problem(
                run,
                "reward.fleet_nodes",
                f"is a fleet of reward servers, which serve reward.kind=sandbox or function; this recipe has "
                f"kind={r.kind}: set reward.fleet_nodes=0",
            )
        )
    elif r.fleet_nodes and not (r.endpoints or r.endpoints_file):  # the job's own fleet, not started here
        out.append(
            _problem(
                run,
                "reward.fleet_nodes",
                "asks for a reward fleet this job starts, and no reward.endpoints or reward.endpoints_file "
                "says where it runs: submit with `megatron-rl submit` (slurm/train.sbatch starts the fleet "
                "on the job's CPU nodes and hands the ranks its endpoints), give reward.endpoints of servers "
                "already running, or set reward.fleet_nodes=0 to score on local sandboxes",
                kind="launch",
            )
        )
    if r.kind == "http" and not re.match(r"https?://[^/\s]+", r.url):
        out.append(_problem(run, "reward.url", "must be an http(s) URL of the judge for reward.kind=http"))
    if r.kind != "http" and r.url:
        out.append(_problem(run, "reward.url", f"is only read with reward.kind=http (this recipe: {r.kind})"))
    return out


def publication(run) -> list[Problem]:
    """What a refused or disagreeing publication can do at the run's sleep level, the agreement's
    thresholds, and what the engines can serve (the rule the engine applies to itself)."""
    cfg, out = run.recipe, []
    # `skip` samples with the previous version after a refusal; a level-2 sleep has discarded it by then
    if cfg.rollout.on_refused_publication == "skip" and run.sleep_level == 2:
        out.append(
            _problem(
                run,
                "rollout.on_refused_publication",
                "skip samples with the previous version after a refusal, but at sleep level 2 (the GPU default "
                "with in-place delivery) the engines discard its weights while training; set "
                "rollout.sleep_level=1 (weights kept on the host) or use stop/retry",
            )
        )
    out += agreement_problems(cfg)  # thresholds for the dtype pair
    lay, experts = run.layout, cfg.model.num_experts or 0
    for key, message in engine_problems(
        run.on_gpu, experts, lay.engine_tp, lay.engine_ep, cfg.algorithm.routing_replay
    ):
        out.append(_problem(run, key, message))
    return out


RULES: tuple[Callable, ...] = (
    names,
    model_shape,
    layout,
    off_policy,
    routing_replay,
    data,
    batch,
    lengths,
    optim,
    sampling,
    reward_and_cluster,
    publication,
    environment,
    ppo,
    reward_model,
)
