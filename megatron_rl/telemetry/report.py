"""Read a finished (or running) run from its step records: where the time and memory went.

Every number comes from `steps.jsonl`, whose phase values are already the maximum over ranks. The
first step is reported apart: engine warm-up and compilation make it many times a steady step, so the
mean, p50 and max columns and the shares cover the steps after it (all steps when there is only one).

Idle time, per step:
  longest completion  batch-slot seconds the engine spent with finished samples' slots empty, waiting
                      on the longest completion (`generation.tail_s`; see loop/record/summary.py)
  reward pool         the `scoring` phase: scoring still running after generation ended
  switch              handing the device between trainer and engine (offload, sleep, wake)
  publication         the `publish` phase: new weights resharded into the engines, and the `probe`
                      phase: the engines' and the trainer's log-probs of a fixed probe, compared
                      before the version serves (loop/placement/probe.py; "publication guard" sums it up)
MFU counts the trainer's model FLOPs (forward, backward and log-prob passes) over the whole step,
against `cluster.peak_tflops_bf16` per device from the recipe.

Whether the run learns: the reward, the gradient norm and the share of "flat" groups (every sample of a
prompt got the same reward: its group-relative advantages are 0 and it teaches nothing) over the first
and the last window of steps, and what the samples' rewards came back as (`reward.statuses`: passed,
failed, no_code, timeout, ...) as shares of the samples of each window. The same reward and status lines
close a run's console (loop/record/records.py).
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path

from megatron_rl.telemetry.jsonl import read_jsonl
from megatron_rl.telemetry.phases import PHASES

STEP_PHASES = tuple(p for p in PHASES if p != "init")
WINDOW = 10
log = logging.getLogger(__name__)


class ReportError(Exception):
    """A run directory or step file that cannot be read; the message says what is wrong."""


def load_records(run: str | Path) -> list[dict]:
    """Step records of a run directory (or of a steps.jsonl path), in step order."""
    path = Path(run)
    if path.is_dir():
        path = path / "steps.jsonl"
    if not path.is_file():
        raise ReportError(f"{run}: no steps.jsonl here; pass a run directory such as outputs/<run>/")
    records = []
    for lineno, rec in read_jsonl(path, ReportError):
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int) or "phases" not in rec:
            raise ReportError(f'{path}:{lineno}: a step record needs an integer "step" and "phases"')
        records.append(rec)
    if not records:
        raise ReportError(f"{path}: no step records yet")
    # A resumed run appends: keep the last record of each step.
    return sorted({r["step"]: r for r in records}.values(), key=lambda r: r["step"])


def _get(rec: dict, *keys, default=None):
    for k in keys:
        if not isinstance(rec, dict) or k not in rec:
            return default
        rec = rec[k]
    return rec


def _secs(rec: dict, name: str) -> float:
    return float(_get(rec, "phases", name, "seconds", default=0.0))


def _step_s(rec: dict) -> float:
    """A step's wall time without start-up (init is counted once per start, not per step)."""
    return sum(_secs(rec, p) for p in STEP_PHASES)


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"mean": None, "p50": None, "max": None}
    return {"mean": statistics.fmean(xs), "p50": statistics.median(xs), "max": max(xs)}


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else None


def _stop_fraction(rec: dict) -> float | None:
    """Share of completions that ended on a stop token (older records hold only the truncated share)."""
    if "stop_fraction" in rec:
        return rec["stop_fraction"]
    truncated = _get(rec, "tokens", "truncated_fraction")
    return None if truncated is None else 1.0 - truncated


TRENDS = {
    "reward": lambda r: _get(r, "reward", "mean"),
    "grad norm": lambda r: _get(r, "train", "grad_norm"),
    "flat groups": lambda r: _get(r, "reward", "flat_group_fraction"),
    "KL": lambda r: _get(r, "train", "kl"),
    "log-prob agreement |d|": lambda r: _get(r, "logprob_agreement", "mean_abs_diff"),
    "stop fraction": _stop_fraction,
    # PPO: the critic's loss and the share of the returns' variance its values explain
    "value loss": lambda r: r.get("value_loss"),
    "explained variance": lambda r: r.get("explained_variance"),
    "returns variance": lambda r: r.get("returns_variance"),
    "residual variance": lambda r: r.get("residual_variance"),
}
CRITIC_TRENDS = ("value loss", "explained variance", "returns variance", "residual variance")


def turns_summary(records: list[dict], w: int) -> dict | None:
    """Multi-turn figures (rollout.env; None for single-turn runs): turns per trajectory, environment
    seconds, the observations' share of the trained tokens, token_exact over every step, and the share
    solved at the first turn and after feedback, first window -> last."""
    if not any((r.get("turns_max") or 0) > 1 or r.get("env_seconds") for r in records):
        return None

    def window(key: str) -> dict:
        series = [r.get(key) for r in records]
        return {"first": _mean(series[:w]), "last": _mean(series[-w:])}

    exact = [r.get("token_exact") for r in records]
    return {
        "turns_mean": _mean([r.get("turns_mean") for r in records]),
        "turns_max": max(r.get("turns_max") or 0 for r in records),
        "env_seconds_per_step": _mean([r.get("env_seconds") for r in records]),
        "env_token_fraction": _mean([r.get("env_token_fraction") for r in records]),
        "token_exact_steps": sum(e is True for e in exact),
        "steps": len(records),
        "solved_first_turn": window("solved_first_turn"),
        "solved_after_feedback": window("solved_after_feedback"),
    }


def turns_lines(t: dict | None) -> list[str]:
    if not t:
        return []
    exact = (
        "every step"
        if t["token_exact_steps"] == t["steps"]
        else f"{t['token_exact_steps']} of {t['steps']} steps"
    )
    a, f = t["solved_after_feedback"], t["solved_first_turn"]
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    return [
        f"multi-turn: {_f(t['turns_mean'], '{:.2f}')} turns per trajectory (max {t['turns_max']}); environments "
        f"{_f(t['env_seconds_per_step'], '{:.2f}')} s per step (summed over trajectories); observations "
        f"{pct(t['env_token_fraction'])} of the trained sequences' tokens; trainer ids = engine ids on {exact}",
        f"solved at the first turn {pct(f['first'])} -> {pct(f['last'])}, after feedback {pct(a['first'])} -> "
        f"{pct(a['last'])}",
    ]


def status_shares(records: list[dict]) -> dict[str, float]:
    """Each reward status's share of the samples of `records` (their `reward.statuses` counts), the
    most frequent first; {} when the records hold no statuses."""
    counts: dict[str, int] = {}
    for r in records:
        for status, n in (_get(r, "reward", "statuses", default=None) or {}).items():
            counts[status] = counts.get(status, 0) + int(n)
    total = sum(counts.values())
    if total <= 0:
        return {}
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}


def _steps_of(records: list[dict]) -> list[int]:
    return [records[0]["step"], records[-1]["step"]]


def summarize(records: list[dict]) -> dict:
    """Everything `megatron-rl report` prints, as one JSON-able dict."""
    first, steady = records[0], (records[1:] if len(records) > 1 else records)
    total = sum(_step_s(r) for r in steady)
    phases = {}
    for name in PHASES:
        pool = [r for r in records if _secs(r, name) > 0] if name == "init" else steady
        secs = [_secs(r, name) for r in pool]
        mem = [float(_get(r, "phases", name, "mem_gib", default=0.0)) for r in pool if _secs(r, name) > 0]
        phases[name] = {
            "seconds": _stats(secs),
            "mem_gib": _stats(mem),
            "first_step_s": _secs(first, name),
            "share": None if name == "init" or total <= 0 else sum(secs) / total,
        }
    step = _stats([_step_s(r) for r in steady])
    step["first_step_s"] = _step_s(first)
    # Separated and asynchronous, the engines' phases overlap the trainer's: the wall clock between step
    # ends is the step then, and the sum of the phases above counts the overlapped seconds twice.
    walls = [r["wall_seconds"] for r in steady if r.get("wall_seconds") is not None]
    wall = _stats(walls) if walls and len(walls) == len(steady) else None
    overlapped = wall is not None and sum(walls) < 0.9 * total

    def idle(values: list[float | None]) -> dict:
        known = [v for v in values if v is not None]
        if not known:
            return {"seconds_per_step": None, "share": None}
        return {"seconds_per_step": statistics.fmean(known), "share": sum(known) / total if total else None}

    idle_time = {
        "longest_completion": idle([_get(r, "generation", "tail_s") for r in steady]),
        "reward_pool": idle([_secs(r, "scoring") for r in steady]),
        "switch": idle([_get(r, "switch_seconds") for r in steady]),
        "publication": idle([_secs(r, "publish") + _secs(r, "probe") for r in steady]),
        "environments": idle([_get(r, "generation", "env_wait_s") for r in steady]),
    }
    gen_s = sum(_secs(r, "generation") for r in steady)
    train_s = sum(_secs(r, "train_fwd_bwd") + _secs(r, "optimizer") for r in steady)
    generated = sum(_get(r, "tokens", "generated", default=0) for r in steady)
    trained = sum(_get(r, "tokens", "trained", default=0) for r in steady)
    world = len(_get(first, "phases", "generation", "seconds_by_rank", default=[None]))
    peak = _get(first, "flops", "peak_per_device")
    flops = [_get(r, "flops", "trainer") for r in steady]
    mfu = None
    if peak and total > 0 and all(f is not None for f in flops):
        mfu = sum(flops) / (total * world * peak)
    n = len(records)
    w = min(WINDOW, max(n // 2, 1))
    trends = {}
    for label, get in TRENDS.items():
        series = [get(r) for r in records]
        if label in CRITIC_TRENDS and all(v is None for v in series):
            continue  # not a PPO run: no critic
        trends[label] = {
            "first": _mean(series[:w]),
            "last": _mean(series[-w:]),
            "window": w,
            "series": series,
        }
    first_w, last_w = records[:w], records[-w:]
    return {
        "steps": n,
        "first_step": first["step"],
        "last_step": records[-1]["step"],
        "ranks": world,
        "phases": phases,
        "step": step,
        "wall": wall if overlapped else None,
        "idle": idle_time,
        "guard": guard_summary(records, total / len(steady) if steady else 0.0),
        "turns": turns_summary(records, w),
        "throughput": {
            "generated_tokens_per_s": generated / gen_s if gen_s > 0 else None,
            "trained_tokens_per_s": trained / train_s if train_s > 0 else None,
            "end_to_end_tokens_per_s": (trained / sum(walls) if overlapped else trained / total)
            if total > 0
            else None,
            "mfu": mfu,
            "peak_flops_per_device": peak,
        },
        "trends": trends,
        # The windows the trends compare, as step numbers [first, last] (a resumed console: not from 1)
        "windows": {"size": w, "first": _steps_of(first_w), "last": _steps_of(last_w)},
        "statuses": {
            "first": status_shares(first_w),
            "last": status_shares(last_w),
            "run": status_shares(records),
        },
    }


# ---- text -------------------------------------------------------------------------------------------
def _f(x, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _pct(x) -> str:
    return _f(None if x is None else 100 * x, "{:.1f}%")


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(r)]
        out.append("  " + "  ".join(cells))
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _steps(a: int, b: int) -> str:
    return f"step {a}" if a == b else f"steps {a}-{b}"


def _span(s: dict) -> str:
    if s["steps"] == 1:
        return f"step {s['first_step']} only"
    return f"{_steps(s['first_step'] + 1, s['last_step'])}; step {s['first_step']} (warm-up) apart"


def percent(x: float) -> str:
    """A share as a percentage a reader can tell from 0 and 100 (0.4%, 25%, 99.6%)."""
    pct = 100 * x
    return f"{pct:.0f}%" if pct in (0, 100) or 1 <= pct <= 99 else f"{pct:.1f}%"


def learning_lines(s: dict) -> list[str]:
    """Whether the run learns, in two lines: the reward of the first and the last window of steps, then
    the statuses' shares and the gradient norm in the same windows (one window when the run has one step)."""
    win, reward = s["windows"], s["trends"]["reward"]
    first, last = reward["first"], reward["last"]
    head = f"reward: {_f(first, '{:.4f}')} ({_steps(*win['first'])})"
    if win["first"] != win["last"]:
        # A ratio only means something from a non-zero start (x inf says nothing a user can use).
        ratio = f", x{last / first:.2f}" if first and last is not None and first > 0 else ""
        head += f" -> {_f(last, '{:.4f}')} ({_steps(*win['last'])}){ratio}"
    statuses = status_line(s)
    return [
        head + f", over {_count(s['steps'], 'step')}",
        *([statuses] if statuses else []),
        *critic_line(s),
    ]


def pooled_explained_variance(trends: dict, window: str) -> float | None:
    """1 - the window's mean residual variance over its mean returns variance: the share of the returns'
    variance the critic explains over the window's steps together (a step whose returns barely vary has an
    unbounded ratio of its own, and would swing a mean of ratios)."""
    ret, res = trends["returns variance"][window], trends["residual variance"][window]
    if ret is None or res is None or ret <= 0:
        return None
    return 1.0 - res / ret


def critic_line(s: dict) -> list[str]:
    """PPO's critic, first window -> last: its value loss and explained variance, pooled over each window
    (none for GRPO)."""
    v = s["trends"].get("value loss")
    if v is None or (v["first"] is None and v["last"] is None):
        return []
    one = s["windows"]["first"] == s["windows"]["last"]
    ev = {w: pooled_explained_variance(s["trends"], w) for w in ("first", "last")}

    def moved(t: dict, fmt: str) -> str:
        return _f(t["first"], fmt) if one else f"{_f(t['first'], fmt)} -> {_f(t['last'], fmt)}"

    return [f"critic: value loss {moved(v, '{:.3g}')}, explained variance {moved(ev, '{:.2f}')} (pooled)"]


def status_line(s: dict) -> str:
    """The reward statuses' shares of the samples and the gradient norm, first window -> last ("" when
    the records hold neither)."""
    st, one = s["statuses"], s["windows"]["first"] == s["windows"]["last"]

    def moved(first, last, fmt) -> str:
        return fmt(first) if one else f"{fmt(first)} -> {fmt(last)}"

    names = list(dict.fromkeys([*st["first"], *st["last"]]))
    parts = [f"{k} {moved(st['first'].get(k, 0.0), st['last'].get(k, 0.0), percent)}" for k in names]
    g = s["trends"]["grad norm"]
    known = g["first"] is not None or g["last"] is not None
    gnorm = [f"grad norm {moved(g['first'], g['last'], lambda x: _f(x, '{:.3g}'))}"] if known else []
    said = ([f"statuses: {', '.join(parts)}"] if parts else []) + gnorm
    return "; ".join(said)


def phase_lines(s: dict) -> list[str]:
    """The per-phase table: seconds (mean, p50, max), the first step, share of a step, peak memory."""
    rows = [("phase", "mean s", "p50 s", "max s", f"step {s['first_step']} s", "share", "peak GiB")]
    for name in PHASES:
        p = s["phases"][name]
        if not p["seconds"]["max"] and not p["first_step_s"]:
            continue  # a phase this run does not have (no reference model, say)
        sec = p["seconds"]
        rows.append(
            (
                name,
                _f(sec["mean"]),
                _f(sec["p50"]),
                _f(sec["max"]),
                _f(p["first_step_s"]),
                _pct(p["share"]),
                _f(p["mem_gib"]["max"]),
            )
        )
    st = s["step"]
    rows.append(("step", _f(st["mean"]), _f(st["p50"]), _f(st["max"]), _f(st["first_step_s"]), "100%", ""))
    if s.get("wall"):  # the phases overlap (separated, async): the sum above is work, this is time
        w = s["wall"]
        rows.append(("wall (overlap)", _f(w["mean"]), _f(w["p50"]), _f(w["max"]), "", "", ""))
    idle = s["idle"]
    parts = [
        f"{label} {_f(idle[key]['seconds_per_step'])} s ({_pct(idle[key]['share'])})"
        for key, label in (
            ("longest_completion", "waiting on the longest completion"),
            ("reward_pool", "on the reward pool"),
            ("switch", "on the trainer/engine switch"),
            ("publication", "on publication (its probe included)"),
            ("environments", "on environments"),
        )
        if key != "environments" or idle[key]["seconds_per_step"]  # multi-turn runs only
    ]
    return [
        f"per phase, seconds of the slowest rank ({_span(s)}):",
        *_table(rows),
        "idle per step: " + ", ".join(parts),
        *guard_lines(s.get("guard")),
        *turns_lines(s.get("turns")),
    ]


def guard_summary(records: list[dict], step_s: float) -> dict | None:
    """The log-prob probe of the run's publications (loop/placement/probe.py): how many, how many it refused, what
    its phase took per step (the slowest rank's, after the first step) and how close the clean versions
    came to the thresholds."""
    probes = [(r["step"], _get(r, "publication", "probe")) for r in records]
    probes = [(step, p) for step, p in probes if isinstance(p, dict)]
    if not probes:
        return None
    later = [_secs(r, "probe") for r in records[1:]] if len(records) > 1 else [_secs(records[0], "probe")]
    passed = [p for _, p in probes if p.get("passed")]
    return {
        "probes": len(probes),
        "refused_versions": [p["version"] for _, p in probes if not p.get("passed")],
        "seconds_per_step": statistics.fmean(later) if later else None,
        "share": statistics.fmean(later) / step_s if later and step_s else None,
        "clean_max_abs_diff": max((p["max_abs_diff"] for p in passed), default=None),
        "clean_mean_abs_diff": max((p["mean_abs_diff"] for p in passed), default=None),
        "max_gap": probes[-1][1].get("max_gap"),
        "mean_gap": probes[-1][1].get("mean_gap"),
    }


def guard_lines(g: dict | None) -> list[str]:
    if not g:
        return []
    refused = g["refused_versions"]
    said = f"refused versions {', '.join(map(str, refused))}" if refused else "refused none"
    return [
        f"publication guard: {g['probes']} probes, {said}; {_f(g['seconds_per_step'], '{:.3f}')} s per step "
        f"({_pct(g['share'])}); clean versions' largest gap {_f(g['clean_max_abs_diff'], '{:.2g}')} nats "
        f"(threshold {_f(g['max_gap'], '{:.2g}')}), mean {_f(g['clean_mean_abs_diff'], '{:.2g}')} "
        f"(threshold {_f(g['mean_gap'], '{:.2g}')})"
    ]


def phase_table(records: list[dict]) -> str:
    """What the end of a run prints: the per-phase table and the idle line."""
    return "\n".join(phase_lines(summarize(records)))


def closing_lines(records: list[dict]) -> str:
    """The end of a run's console: reward, statuses and gradient norm (first window -> last), the
    per-phase table and the idle line."""
    s = summarize(records)
    return "\n".join([*learning_lines(s), *phase_lines(s)])


def render(s: dict, run: str) -> str:
    t = s["throughput"]
    mfu = (
        f"MFU {_pct(t['mfu'])} of {t['peak_flops_per_device'] / 1e12:g} TFLOP/s per device (recipe cluster peak)"
        if t["mfu"] is not None
        else "MFU unknown (no device peak in the records)"
    )
    lines = [f"run {run}: {_count(s['steps'], 'step')}, {_count(s['ranks'], 'rank')}", *phase_lines(s), ""]
    lines.append(
        f"throughput: generated {_f(t['generated_tokens_per_s'], '{:,.0f}')} tok/s while generating, "
        f"trained {_f(t['trained_tokens_per_s'], '{:,.0f}')} tok/s while training, "
        f"{_f(t['end_to_end_tokens_per_s'], '{:,.0f}')} tok/s end to end; {mfu}"
    )
    win = s["windows"]
    if win["first"] == win["last"]:  # one window (a one-step run): its values, not a value "->" itself
        lines.append(f"trends ({_steps(*win['first'])} only):")
        lines += [f"  {label:<24} {_f(tr['first'], '{:.4g}')}" for label, tr in s["trends"].items()]
    else:
        lines.append(f"trends (mean of {_steps(*win['first'])} -> {_steps(*win['last'])}):")
        for label, tr in s["trends"].items():
            lines.append(f"  {label:<24} {_f(tr['first'], '{:.4g}')} -> {_f(tr['last'], '{:.4g}')}")
    statuses = status_line(s)
    if statuses:  # older records hold neither statuses nor a gradient norm
        lines.append(statuses)
    if s.get("no_signal"):  # the caller's diagnosis (cli/report.py: loop/record/signal.py)
        lines.append(s["no_signal"]["line"])
    return "\n".join(lines) + "\n"


def render_compare(a: dict, b: dict, name_a: str, name_b: str) -> str:
    """Two runs side by side: p50 seconds per phase, idle, throughput and trends, with B/A ratios."""

    def ratio(x, y):
        return _f(y / x, "x{:.2f}") if x and y is not None else "-"

    rows = [("p50 seconds", "A", "B", "B/A")]
    for name in STEP_PHASES:
        x, y = a["phases"][name]["seconds"]["p50"], b["phases"][name]["seconds"]["p50"]
        if x or y:
            rows.append((name, _f(x), _f(y), ratio(x, y)))
    rows.append(
        ("step", _f(a["step"]["p50"]), _f(b["step"]["p50"]), ratio(a["step"]["p50"], b["step"]["p50"]))
    )
    for key in ("longest_completion", "reward_pool", "switch", "publication"):
        x, y = a["idle"][key]["seconds_per_step"], b["idle"][key]["seconds_per_step"]
        rows.append((f"idle: {key}", _f(x), _f(y), ratio(x, y)))
    for key in ("generated_tokens_per_s", "trained_tokens_per_s", "end_to_end_tokens_per_s"):
        x, y = a["throughput"][key], b["throughput"][key]
        rows.append((key, _f(x, "{:,.0f}"), _f(y, "{:,.0f}"), ratio(x, y)))
    for label in dict.fromkeys([*a["trends"], *b["trends"]]):  # a PPO run beside a GRPO one: its critic's too
        x, y = (t["trends"].get(label, {}).get("last") for t in (a, b))
        rows.append((f"{label} (last)", _f(x, "{:.4g}"), _f(y, "{:.4g}"), ratio(x, y)))
    head = [f"A = {name_a} ({a['steps']} steps)", f"B = {name_b} ({b['steps']} steps)"]
    return "\n".join([*head, *_table(rows)]) + "\n"
