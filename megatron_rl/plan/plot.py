"""A Gantt chart of two steps: the recipe's own layout, and the layout the text ranks first.

The picture is read next to the text, so it draws what the text says: the recipe's step as section 5
states it (measured when calibrated), and the first layout of section 10's ranking (without the
search: section 5's overlapped split), each the way it runs: one serial lane when colocated or
synchronous, an engines lane and a trainer lane when separated and asynchronous. The title gives both
step times as the text prints them. `picture` is the data (which layouts, which bars), `figure` draws
it, `gantt` writes the PNG. Matplotlib is imported in `figure` only, with the Agg backend, so `plan`
without --plot never loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_rl.plan.cycle import COLLECTION, LEARNING
from megatron_rl.plan.report_types import CycleRow, PlanReport
from megatron_rl.plan.wording import count, num

COLORS = {
    "switch": "#bbbbbb",
    "generation": "#4c72b0",
    "scoring": "#dd8452",
    "reward_model": "#da8bc3",  # a learned reward model's forward (on the trainer GPUs)
    "old_logprobs": "#55a868",
    "ref_logprobs": "#8fd19e",
    "critic_values": "#64b5cd",  # PPO's critic
    "train_fwd_bwd": "#c44e52",
    "optimizer": "#8172b3",
    "critic_train": "#2a7f9e",
    "publish": "#937860",
    "other": "#999999",
}
ORDER = tuple(COLORS)
STEPS = 2

Bar = tuple[str, float, float]  # phase, start, seconds


@dataclass(frozen=True)
class Lane:
    label: str
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class Drawn:
    """One layout as the picture draws it: who it is, its description, its step and its lanes."""

    role: str  # "this recipe", "ranked first" (section 10) or "best split" (section 5, no search)
    describe: str
    step_s: float
    lanes: tuple[Lane, ...]


def _bars(phases: Mapping[str, float], names: tuple, start: float) -> list[Bar]:
    """Consecutive bars of the named phases from `start`, skipping the ones that take no time."""
    out, t = [], start
    for name in names:
        d = phases.get(name, 0.0)
        if d > 0:
            out.append((name, t, d))
            t += d
    return out


def _drawn(role: str, row: CycleRow, phases: Mapping[str, float]) -> Drawn:
    """`row`'s lanes over STEPS steps from its `phases` (the recipe's may be the measured ones)."""
    phases = {k: v for k, v in phases.items() if k in COLORS}
    if row.placement == "separated" and row.synchrony == "async":
        collection = sum(phases.get(p, 0.0) for p in COLLECTION)
        period = max(collection, sum(phases.get(p, 0.0) for p in LEARNING))
        coll: list[Bar] = []
        learn: list[Bar] = []
        for k in range(STEPS + 1):
            coll += _bars(phases, ("generation", "scoring"), k * period)
            if k < STEPS:  # step k learns once its batch is collected, while step k+1 is collected
                learn += _bars(phases, LEARNING, k * period + collection)
        lanes = (
            Lane(f"{role}: engines ({count(row.engine_gpus, 'GPU')}) + CPU pool", tuple(coll)),
            Lane(f"{role}: trainer ({count(row.trainer_gpus, 'GPU')})", tuple(learn)),
        )
        return Drawn(role, row.describe, period, lanes)
    period = sum(phases.values())
    bars = [bar for k in range(STEPS) for bar in _bars(phases, ORDER, k * period)]
    label = f"{role}: serial ({row.placement}, {count(row.gpus, 'GPU')})"
    return Drawn(role, row.describe, period, (Lane(label, tuple(bars)),))


def picture(report: PlanReport) -> list[Drawn]:
    """What the picture draws: the recipe's layout at the step section 5 states, then the layout section
    10 ranks first (or, without the search, section 5's overlapped split), unless it is the recipe's own."""
    out = [_drawn("this recipe", report.layout, report.phases_s)]
    if report.search is not None and report.search.ranked:
        role, other = "ranked first", report.search.ranked[0]
    else:
        role, other = "best split", report.overlap
    if other is not None and other.describe != report.layout.describe:
        out.append(_drawn(role, other, other.phases_s))
    return out


def figure(report: PlanReport) -> Any:
    """The matplotlib Figure of `picture(report)`: lanes top to bottom, the legend outside the axes (right
    of them, with room made for it: it covers no bar and no label), one entry per phase drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = picture(report)
    lanes = [lane for d in drawn for lane in d.lanes]
    fig, ax = plt.subplots(figsize=(12, 2.0 + 0.6 * len(lanes)), layout="constrained")
    for row, lane in enumerate(lanes):
        y = len(lanes) - 1 - row
        for name, start, dur in lane.bars:
            ax.barh(y, dur, left=start, color=COLORS[name], edgecolor="white", height=0.6)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([lane.label for lane in reversed(lanes)], fontsize=8)
    ax.set_xlabel("seconds")
    steps = "; ".join(f"{d.role} {num(d.step_s)} s per step" for d in drawn)
    title = [f"{report.recipe}, {STEPS} steps of each layout: {steps}"]
    title += [f"{d.role}: {d.describe}" for d in drawn]
    ax.set_title("\n".join(title), fontsize=9)
    shown = [n for n in ORDER if any(bar[0] == n for lane in lanes for bar in lane.bars)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[n]) for n in shown]
    fig.legend(handles, shown, fontsize=7, loc="outside right upper", frameon=False)
    return fig


def gantt(report: PlanReport, path: str | Path) -> Path:
    """Write the PNG of `figure(report)`; returns the path written (".png" added when missing)."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    out = Path(path)
    if out.suffix.lower() != ".png":
        out = out.with_name(out.name + ".png")  # what matplotlib would write; now said, not surprising
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
