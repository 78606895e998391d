"""Pictures of a run from its step records: `timeline.png` (written at the end of every run, also sent to
W&B) and `megatron-rl report --plot` (the timeline plus the learning trends).

Each step is one stacked bar of its phases, each phase the slowest rank's seconds. The first step is
drawn apart, on its own scale, together with start-up (`init`): engine warm-up and compilation make it
many times longer than a steady step, and on a shared axis it would flatten every other bar.
"""

from __future__ import annotations

from pathlib import Path

from megatron_rl.telemetry.phases import PHASES

STEP_PHASES = tuple(p for p in PHASES if p != "init")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colours(plt) -> dict[str, tuple]:
    return dict(zip(PHASES, plt.get_cmap("tab20").colors))


def _seconds(rec: dict, name: str) -> float:
    return float(rec.get("phases", {}).get(name, {}).get("seconds", 0.0))


def _stack(ax, xs: list, records: list[dict], names: tuple[str, ...], colours: dict, width: float = 0.8):
    bottom = [0.0] * len(records)
    for name in names:
        heights = [_seconds(r, name) for r in records]
        if any(h > 0 for h in heights):
            ax.bar(xs, heights, width, bottom=bottom, color=colours[name], edgecolor="none", label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]


def _draw_steps(fig, spec, records: list[dict], colours: dict) -> None:
    """First step (with start-up) on the left, the other steps on the right, each on its own scale."""
    first, rest = records[0], records[1:]
    inner = spec.subgridspec(1, 2, width_ratios=[1, 7], wspace=0.25)
    ax0 = fig.add_subplot(inner[0])
    _stack(ax0, [0], [first], PHASES, colours, width=0.6)
    ax0.set_xticks([0], [f"step {first['step']}\n+ start-up"])
    ax0.set_ylabel("seconds (slowest rank)")
    ax0.set_title("warm-up", fontsize=9)
    ax1 = fig.add_subplot(inner[1])
    overlapped = False
    if rest:
        _stack(ax1, [r["step"] for r in rest], rest, STEP_PHASES, colours)
        walls = [(r["step"], r["wall_seconds"]) for r in rest if "wall_seconds" in r]
        # Separated and asynchronous, the engine's phases run while the trainer's do: the bar sums work
        # on both pools, and the wall clock between step ends sits below its top.
        overlapped = bool(walls) and any(
            w < sum(_seconds(r, p) for p in STEP_PHASES) * 0.9 for r, (_, w) in zip(rest, walls)
        )
        if overlapped:
            xs, ys = zip(*walls)
            ax1.plot(xs, ys, "k_", markersize=22, markeredgewidth=2.5, label="wall clock")
        ax1.set_xlabel("step")
        ax1.set_title(f"steps {rest[0]['step']}-{rest[-1]['step']}: phases per step", fontsize=9)
    else:
        ax1.text(0.5, 0.5, "only one step", ha="center", va="center", transform=ax1.transAxes)
    _integer_steps(ax1)
    import matplotlib.patches as mpatches

    handles = [mpatches.Patch(color=colours[p]) for p in PHASES]
    labels = list(PHASES)
    if overlapped:
        import matplotlib.lines as mlines

        handles.append(
            mlines.Line2D([], [], color="k", marker="_", linestyle="none", markersize=12, markeredgewidth=2.5)
        )
        labels.append("wall clock (phases overlap)")
    ax1.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_memory(ax, records: list[dict], colours: dict) -> None:
    for name in PHASES:
        ran = [(r["step"], r["phases"][name]["mem_gib"]) for r in records if _seconds(r, name) > 0]
        if ran:
            xs, ys = zip(*ran)
            ax.plot(xs, ys, marker=".", color=colours[name], label=name)
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("peak memory, GiB\n(max over ranks)")
    ax.set_title("peak memory per phase", fontsize=9)


def plot_timeline(records: list[dict], path: Path) -> Path:
    """Per-step stacked phase bars (first step apart) above peak memory per phase."""
    plt = _plt()
    colours = _colours(plt)
    fig = plt.figure(figsize=(11, 6.5))
    grid = fig.add_gridspec(2, 1, height_ratios=[1.3, 1], hspace=0.35)
    _draw_steps(fig, grid[0], records, colours)
    _draw_memory(fig.add_subplot(grid[1]), records, colours)
    return _save(fig, plt, path)


def _trend(ax, records: list[dict], get, title: str) -> None:
    pts = [(r["step"], v) for r in records if (v := get(r)) is not None]
    if pts:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker=".", lw=1)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    _integer_steps(ax)
    ax.tick_params(labelsize=7)


def plot_report(records: list[dict], path: Path) -> Path:
    """The timeline and memory panels, plus reward, KL, log-prob agreement and stop-fraction trends."""
    from megatron_rl.telemetry.report import TRENDS

    plt = _plt()
    colours = _colours(plt)
    fig = plt.figure(figsize=(12, 10))
    grid = fig.add_gridspec(3, 1, height_ratios=[1.3, 1, 0.9], hspace=0.45)
    _draw_steps(fig, grid[0], records, colours)
    _draw_memory(fig.add_subplot(grid[1]), records, colours)
    row = grid[2].subgridspec(1, len(TRENDS), wspace=0.35)
    for i, (label, get) in enumerate(TRENDS.items()):
        _trend(fig.add_subplot(row[i]), records, get, label)
    return _save(fig, plt, path)


def _save(fig, plt, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
