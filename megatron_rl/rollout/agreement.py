"""When do the engine and the trainer disagree? Thresholds set by precision, and the verdict.

The manifest and checksums of a publication prove that the engines received the bytes the trainer
sent; they cannot see a conversion bug (a wrong row order in a fused QKV or gate/up tensor, a layer left
at the previous version, a few scrambled values): those are self-consistent bytes of another model.
Only the engine-vs-trainer log-prob agreement on the same tokens sees them (rollout/logprob_check.py
measures it; loop/placement/probe.py runs it on every publication before the engines serve it).

How far apart two correct implementations may be depends on the arithmetic both run in, so the
thresholds are per pair of (trainer parameter dtype, engine dtype), each the clean floor measured here
times a margin, on two figures of one comparison:
- `max`: the largest |trainer - engine| over the compared tokens, in nats;
- `mean`: the mean |trainer - engine| over those tokens.
A comparison passes when both are at or under their thresholds, at least one token was compared and
every compared token was finite. Whatever cannot be proven (no token, NaN, inf) is a disagreement.

The clean floors (`FLOORS`) were measured by `benchmarks/agreement.py` on the probe of every
publication and the step of real runs (the tiny recipe, the HF-format fixture, the MoE model, separated
pools, and the 60-step demo) together with the faults it injects (reshard/faults.py): fp32 against fp32
agrees to float rounding (at most 3.8e-6 nats, 7e-7 in the mean), a bf16 engine against an fp32 trainer
to bf16 rounding (at most 0.105, 0.013 in the mean). In fp32 the thresholds (10x the floor) catch every
injected fault, the smallest (1e-3 relative noise in one layer's fc2) at 1.3x the max threshold and
2.6x the mean one. A bf16 engine cannot see faults smaller than its own rounding: with it only gross
faults (a zeroed projection, most stale layers) are caught, and the README's table says which. A
recipe may set its own thresholds (`rollout.logprob_max_gap`, `rollout.logprob_mean_gap`; 0 = from
this table).

Pure (no torch): `validate` prints the thresholds in force.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from megatron_rl.models.dtypes import recipe_dtype


@dataclass(frozen=True)
class Floor:
    """The clean agreement measured for one dtype pair (benchmarks/agreement.py), and the margin over it.
    `step_max`: whether the step's own check judges its max gap too (see `problems`)."""

    max_gap: float
    mean_gap: float
    margin: float
    step_max: bool = True


# (trainer params dtype, engine dtype) -> the clean floor: the largest gaps of any clean probe or step of
# the measured runs (benchmarks/agreement.py; the 60-step demo sets them: its logits sharpen as it learns,
# and the floor rises with them: fp32 from 5e-7 to 3.8e-6 max, a bf16 engine from 4e-3 to 0.105).
FLOORS: dict[tuple[str, str], Floor] = {
    ("fp32", "fp32"): Floor(max_gap=4.0e-6, mean_gap=8.0e-7, margin=10.0),
    ("fp32", "bf16"): Floor(max_gap=0.105, mean_gap=0.013, margin=5.0, step_max=False),
    # Not measured (a bf16 trainer does not publish on the CPU build): the bf16 engine's floor twice over,
    # for the trainer's own bf16 rounding on top of the engine's.
    ("bf16", "bf16"): Floor(max_gap=0.21, mean_gap=0.026, margin=5.0, step_max=False),
}


@dataclass(frozen=True)
class Thresholds:
    """The agreement thresholds in force, and where each comes from."""

    max_gap: float
    mean_gap: float
    trainer_dtype: str
    engine_dtype: str
    source: str  # "precision" (FLOORS x margin), "recipe", or "recipe (max) / precision (mean)", ...
    step_max: bool = True  # the step's own check judges its max gap (fp32), or its mean alone (bf16)

    def as_dict(self) -> dict:
        return asdict(self)


def thresholds_for(
    trainer_dtype: str, engine_dtype: str, max_gap: float = 0.0, mean_gap: float = 0.0
) -> Thresholds:
    """The thresholds for this dtype pair: the recipe's where it sets one (> 0), else floor x margin."""
    t, e = recipe_dtype(trainer_dtype, "model.params_dtype"), recipe_dtype(engine_dtype, "rollout.dtype")
    floor = FLOORS.get((t, e))
    if floor is None and not (max_gap > 0 and mean_gap > 0):
        raise KeyError(
            f"no clean agreement was measured for a {t} trainer and a {e} engine: set rollout.logprob_max_gap "
            "and rollout.logprob_mean_gap"
        )
    derived = (floor.max_gap * floor.margin, floor.mean_gap * floor.margin) if floor else (0.0, 0.0)
    chosen = (max_gap if max_gap > 0 else derived[0], mean_gap if mean_gap > 0 else derived[1])
    sources = ["recipe" if v > 0 else "precision" for v in (max_gap, mean_gap)]
    source = sources[0] if sources[0] == sources[1] else f"{sources[0]} (max) / {sources[1]} (mean)"
    return Thresholds(chosen[0], chosen[1], t, e, source, floor.step_max if floor else True)


def problems(stats: dict, thresholds: Thresholds, judge_max: bool = True) -> list[str]:
    """What is wrong with one comparison (rollout/logprob_check.py `compare`'s dict); empty = agreed.

    Fails closed: no compared token, a non-finite token or a NaN figure is a disagreement. `judge_max`
    False: the max gap is not judged (a bf16 step's batch: over millions of tokens the max is an extreme
    value that grows with the batch, and isolated multi-nat tokens are bf16's known training-inference
    mismatch, not a conversion fault; the probe's fixed few tokens judge it)."""
    out = []
    tokens, nonfinite = int(stats.get("tokens", 0)), int(stats.get("nonfinite_tokens", 0))
    biggest, mean = float(stats.get("max_abs_diff", math.nan)), float(stats.get("mean_abs_diff", math.nan))
    if tokens - nonfinite <= 0:
        out.append("no token was compared, so nothing proves the engine serves the trainer's model")
    if nonfinite:
        out.append(
            f"{nonfinite} token(s) the trainer gives probability 0 or the engine a non-finite log-prob"
        )
    if judge_max and not biggest <= thresholds.max_gap:
        out.append(f"max |trainer - engine| {biggest:.3g} nats > {thresholds.max_gap:.3g}")
    if not mean <= thresholds.mean_gap:
        out.append(f"mean |trainer - engine| {mean:.3g} nats > {thresholds.mean_gap:.3g}")
    return out


def worst(per_engine: dict[int, dict]) -> dict:
    """Over engines: the largest max and mean gaps, every token counted (what the record keeps)."""
    stats = list(per_engine.values())
    return {
        "max_abs_diff": max((s["max_abs_diff"] for s in stats), default=math.nan, key=_nan_first),
        "mean_abs_diff": max((s["mean_abs_diff"] for s in stats), default=math.nan, key=_nan_first),
        "tokens": sum(int(s["tokens"]) for s in stats),
        "nonfinite_tokens": sum(int(s["nonfinite_tokens"]) for s in stats),
    }


def _nan_first(x: float) -> float:
    return math.inf if math.isnan(x) else x


def dtypes_of(cfg) -> tuple[str, str]:
    """(trainer, engine) dtypes of a recipe: the engines serve `rollout.dtype`, or the trainer's."""
    trainer = recipe_dtype(cfg.model.params_dtype, "model.params_dtype")
    return trainer, recipe_dtype(cfg.rollout.dtype or trainer, "rollout.dtype")


def thresholds_of(cfg) -> Thresholds:
    """The thresholds a recipe runs with (its own where set, else its dtype pair's)."""
    ro = cfg.rollout
    return thresholds_for(*dtypes_of(cfg), ro.logprob_max_gap, ro.logprob_mean_gap)


def probe_shape(cfg) -> tuple[int, int]:
    """(sequences, tokens each) of the log-prob probe: `rollout.logprob_probe_prompts` (0: no probe) of
    `rollout.logprob_probe_tokens` tokens, within what the engines' context holds (data.max_prompt_tokens +
    rollout.max_new_tokens, one left to generate)."""
    ro = cfg.rollout
    return ro.logprob_probe_prompts, min(
        ro.logprob_probe_tokens, cfg.data.max_prompt_tokens + ro.max_new_tokens - 1
    )


def agreement_problems(cfg) -> list:
    """What the recipe check refuses of the agreement settings (their ranges are checked apart)."""
    from megatron_rl.config.problem import Problem

    ro = cfg.rollout
    out = []
    pair = dtypes_of(cfg)
    if pair not in FLOORS and not (ro.logprob_max_gap > 0 and ro.logprob_mean_gap > 0):
        out.append(
            Problem(
                "rollout.logprob_max_gap",
                ro.logprob_max_gap,
                f"no clean agreement was measured for a {pair[0]} trainer and a {pair[1]} engine, so no "
                "threshold follows from precision: set rollout.logprob_max_gap and rollout.logprob_mean_gap "
                "(nats; benchmarks/agreement.py measures the clean floor)",
            )
        )
    return out


def guard(run) -> dict:
    """How a resolved run's publications are guarded (run/resolve.py `Run`), for `validate`: the
    thresholds in force, the probe, what a disagreement does, and why (if so) a faulty version could
    serve unchecked."""
    ro = run.recipe.rollout
    out: dict = {"action": ro.on_logprob_disagreement}
    out["thresholds"] = run.thresholds.as_dict() if run.thresholds is not None else None
    out["probe"] = dict(zip(("sequences", "tokens"), run.probe))
    unguarded = []
    if ro.logprob_probe_prompts == 0:
        unguarded.append(
            "rollout.logprob_probe_prompts=0: no probe before a version serves; a faulty version draws a "
            "step's samples before the step's own check sees it"
        )
    if ro.on_logprob_disagreement == "warn":
        unguarded.append("rollout.on_logprob_disagreement=warn: a disagreement is reported, never acted on")
    out["unguarded"] = unguarded
    return out
