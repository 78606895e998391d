"""Calibrate the plan with measured step records, and answer "what if we separate the pools".

The loop's telemetry writes one JSON object per step:
    {"step": 12, "phases": {"generation": {"seconds": 118.2, "mem_gib": 51.0}, ...}}
with phase names init, generation, scoring, old_logprobs, ref_logprobs, train_fwd_bwd, optimizer,
publish (`scoring` being the wait for rewards after generation ends). Per phase the median over
steps replaces the assumed time (medians shrug off a slow first step); `init` is start-up, counted
once per (re)start, never per step. Each phase's measured/predicted ratio then rescales the model's
prediction for other layouts: the model says how a phase scales with the split, the measurement
says where it actually sits. A phase the model predicts as zero keeps its measured time.

Scoring is calibrated on the pool's whole time after generation (the record's
`scoring.after_generation_s`), not on the `scoring` phase: a synchronous step that defers its rewards
waits only for what its reward-free forwards leave, so the phase is a difference of two times, and its
ratio says nothing of how long the pool takes. Each other layout's exposed scoring is then the
calibrated whole, less what its own calibrated forwards cover (cycle.py). Records without the key
(older runs) fall back to the phase's ratio.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.cycle import NEED_NO_REWARD, PHASES, Cycle, from_phases
from megatron_rl.plan.inputs import PlanError, PlanInputs
from megatron_rl.plan.search import compare_splits

KNOWN = ("init", *PHASES)
ADDITIVE = ("publish",)


def read_steps(path: str | Path) -> list[dict]:
    """Step records from a JSONL file; a malformed line fails with its number and what is wrong."""
    records = []
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"--from-steps {path}: no such file")
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlanError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise PlanError(f'{where}: each line must be an object with an integer "step"')
        phases = rec.get("phases")
        if not isinstance(phases, dict):
            raise PlanError(f'{where}: "phases" must be an object of phase name -> {{"seconds", "mem_gib"}}')
        for name, ph in phases.items():
            secs = ph.get("seconds") if isinstance(ph, dict) else None
            if (
                not isinstance(secs, int | float)
                or isinstance(secs, bool)
                or secs < 0
                or not math.isfinite(secs)
            ):
                raise PlanError(f'{where}: phase {name!r} needs a non-negative number "seconds"')
        sc = rec.get("scoring")
        after = sc.get("after_generation_s") if isinstance(sc, dict) else None
        if "scoring" in rec and (
            not isinstance(after, int | float)
            or isinstance(after, bool)
            or after < 0
            or not math.isfinite(after)
        ):
            raise PlanError(f'{where}: "scoring" needs a non-negative number "after_generation_s"')
        records.append(rec)
    if not records:
        raise PlanError(f"--from-steps {path}: no step records in the file")
    return records


def summarize(records: list[dict]) -> dict:
    """Median seconds and peak memory per phase; phases the planner does not model go to `other`."""
    seconds: dict[str, list[float]] = {}
    mem: dict[str, float] = {}
    # A phase some steps skip (old_logprobs, when algorithm.old_logprobs=auto drops it) counts 0 s there.
    seen = {name for rec in records for name in rec["phases"] if name in PHASES}
    for rec in records:
        other = 0.0
        for name in seen - set(rec["phases"]):
            seconds.setdefault(name, []).append(0.0)
        for name, ph in rec["phases"].items():
            m = ph.get("mem_gib")
            if isinstance(m, int | float):
                mem[name] = max(mem.get(name, 0.0), float(m))
            if name in KNOWN:
                seconds.setdefault(name, []).append(float(ph["seconds"]))
            else:
                other += float(ph["seconds"])
        if other:
            seconds.setdefault("other", []).append(other)
    med = {name: statistics.median(v) for name, v in seconds.items()}
    after = [float(r["scoring"]["after_generation_s"]) for r in records if "scoring" in r]
    return {
        "steps": len(records),
        "median_s": med,
        "mem_gib_max": mem,
        "init_s": med.pop("init", None),
        # the pool's whole time after generation; None for records that predate the key
        "scoring_after_s": statistics.median(after) if len(after) == len(records) else None,
    }


def _whole_scoring(c: Cycle) -> float:
    """Generation's end to the last reward: the exposed wait plus what the forwards hid (cycle.py)."""
    return c.phases.get("scoring", 0.0) + c.scoring.get("behind_forwards_s", 0.0)


def _rescale(
    option: Cycle, factors: dict, offsets: dict, measured: dict, whole: float | None, defers: bool
) -> dict:
    """`option`'s phases calibrated. `whole`: the calibrated factor on the pool's whole time after
    generation (None: scale the exposed phase like any other); `defers`: the workload's rewards may come
    after the batch (Workload.defer_scoring), so a serial layout's forwards hide part of them."""
    predicted = option.phases
    out = {}
    for name in PHASES:
        f = factors.get(name)
        if name in offsets:
            out[name] = max(0.0, predicted.get(name, 0.0) + offsets[name])
        elif f is not None:
            out[name] = predicted.get(name, 0.0) * f
        elif name in measured:
            out[name] = measured[name]
    if whole is not None:
        scoring = _whole_scoring(option) * whole
        if defers and not option.layout.overlapped:
            scoring -= min(scoring, sum(out.get(p, 0.0) for p in NEED_NO_REWARD))
        out["scoring"] = scoring
    if "other" in measured:
        out["other"] = measured["other"]
    return out


def calibrate(inp: PlanInputs, layout: ParallelLayout, predicted: Cycle, summary: dict) -> dict:
    """Measured vs predicted phases, the measured cycle, and every split of the GPUs, calibrated.

    Measured phases already contain the colocated offload switches (the loop times them inside its
    phases), so calibrated rows carry no separate `switch`.
    """
    measured = summary["median_s"]
    factors = {}
    for name in PHASES:
        if name in measured and predicted.phases.get(name, 0.0) > 0:
            factors[name] = measured[name] / predicted.phases[name]
    offsets = {n: measured[n] - predicted.phases.get(n, 0.0) for n in ADDITIVE if n in measured}
    whole = None
    if summary.get("scoring_after_s") is not None and _whole_scoring(predicted) > 0:
        whole = summary["scoring_after_s"] / _whole_scoring(predicted)
        factors["scoring_after_generation"] = whole
        factors.pop("scoring", None)  # the exposed phase follows from the whole (_rescale)
    phases = {name: measured[name] for name in (*PHASES, "other") if name in measured}
    p = predicted
    now = from_phases(layout, phases, p.gen, p.scoring, p.publication, p.memory)
    rows = []
    for option in compare_splits(inp, layout):
        cal = from_phases(
            option.layout,
            _rescale(option, factors, offsets, measured, whole, inp.work.defer_scoring),
            option.gen,
            option.scoring,
            option.publication,
            option.memory,
        )
        rows.append(cal)
    shown, expected = dict(phases), dict(predicted.phases)
    if whole is not None:  # a row of its own in the calibration table, beside the exposed phase
        shown["scoring_after_generation"] = summary["scoring_after_s"]
        expected["scoring_after_generation"] = _whole_scoring(predicted)
    return {
        "steps": summary["steps"],
        "measured_s": shown,
        "predicted_s": expected,
        "factors": factors,
        "offsets": offsets,
        "init_s": summary["init_s"],
        "mem_gib_max": summary["mem_gib_max"],
        "cycle": now,
        "what_if": rows,
    }
