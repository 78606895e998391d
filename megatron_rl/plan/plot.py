"""A Gantt chart of two steps: the serial cycle, and the overlapped steady state of separated pools.

Matplotlib is imported here only, with the Agg backend, so `plan` without --plot never loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from megatron_rl.plan.report_types import PlanReport

COLORS = {
    "switch": "#bbbbbb",
    "generation": "#4c72b0",
    "scoring": "#dd8452",
    "old_logprobs": "#55a868",
    "ref_logprobs": "#8fd19e",
    "train_fwd_bwd": "#c44e52",
    "optimizer": "#8172b3",
    "publish": "#937860",
    "other": "#999999",
}
ORDER = tuple(COLORS)
STEPS = 2


def _bars(phases: Mapping[str, float], names: tuple, start: float) -> list[tuple[str, float, float]]:
    """Consecutive bars of the named phases from `start`, skipping the ones that take no time."""
    out, t = [], start
    for name in names:
        d = phases.get(name, 0.0)
        if d > 0:
            out.append((name, t, d))
            t += d
    return out


def gantt(report: PlanReport, path: str | Path) -> Path:
    """Write the PNG; lanes: serial (all GPUs), then engines and trainer of the overlapped option."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    serial = {k: v for k, v in report.phases_s.items() if k in COLORS}
    lanes: list[tuple[str, list]] = []
    cyc = report.seconds.serial_cycle
    bars = []
    for k in range(STEPS):
        bars += _bars(serial, ORDER, k * cyc)
    lay = report.layout
    lanes.append((f"serial ({lay.placement}, {lay.gpus} GPUs)", bars))
    ov = report.overlap
    if ov is not None:
        period = ov.overlapped_s
        ph = ov.phases_s
        coll, learn = [], []
        for k in range(STEPS + 1):
            coll += _bars(ph, ("generation", "scoring"), k * period)
            if k < STEPS:  # step k learns once its batch is collected, while step k+1 is collected
                learn += _bars(
                    ph,
                    ("old_logprobs", "ref_logprobs", "train_fwd_bwd", "optimizer", "publish", "other"),
                    k * period + ov.collection_s,
                )
        lanes.append((f"overlapped: engines ({ov.engine_gpus} GPUs) + CPU pool", coll))
        lanes.append((f"overlapped: trainer ({ov.trainer_gpus} GPUs)", learn))

    fig, ax = plt.subplots(figsize=(11, 1.8 + 0.7 * len(lanes)))
    for row, (_, bars) in enumerate(lanes):
        y = len(lanes) - 1 - row
        for name, start, dur in bars:
            ax.barh(y, dur, left=start, color=COLORS[name], edgecolor="white", height=0.6)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for label, _ in reversed(lanes)], fontsize=8)
    ax.set_xlabel("seconds")
    title = f"{report.recipe}: serial cycle {cyc:.0f} s"
    if ov is not None:
        title += f", overlapped steady state {ov.overlapped_s:.0f} s\noverlapped on {ov.describe}"
    ax.set_title(title, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[n]) for n in ORDER]
    ax.legend(handles, ORDER, fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    out = Path(path)
    if out.suffix.lower() != ".png":
        out = out.with_name(out.name + ".png")  # what matplotlib would write; now said, not surprising
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
