"""Where step records go: a JSONL file, Weights & Biases, a progress bar, and a timeline PNG.

Only rank 0 writes (the records already hold the max over ranks). W&B runs offline when no API key
is configured, respects WANDB_MODE (offline / disabled / online), and groups runs by recipe name.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from megatron_rl.telemetry.phases import PHASES


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    """Nested step record -> flat 'phases/generation/seconds' keys with numeric values (for W&B)."""
    out: dict[str, float] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, int | float):
            out[key] = v
    return out


class WandbSink:
    """W&B logging; offline without an API key, nothing at all with WANDB_MODE=disabled."""

    def __init__(self, project: str, group: str, name: str, run_dir: Path, config: dict):
        import wandb

        mode = os.environ.get("WANDB_MODE")
        if mode is None:
            has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
            mode = "online" if has_key else "offline"
        self.run = wandb.init(
            project=project,
            group=group,
            name=name,
            dir=str(run_dir),
            mode=mode,
            config=config,
            reinit="finish_previous",
        )
        self.mode = mode

    def write(self, record: dict) -> None:
        self.run.log(flatten({k: v for k, v in record.items() if k != "step"}), step=record["step"])

    def close(self) -> None:
        self.run.finish()


class Progress:
    """A tqdm bar over steps showing reward and the phase now running."""

    def __init__(self, total: int, enabled: bool = True, initial: int = 0):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=not enabled,
            desc="grpo",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def phase(self, name: str) -> None:
        self.bar.set_postfix_str(f"phase={name}", refresh=True)

    def step(self, record: dict) -> None:
        r = record.get("reward", {}).get("mean", float("nan"))
        self.bar.set_description(f"grpo reward={r:.3f}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def plot_timeline(records: list[dict], path: Path) -> Path:
    """A PNG of the phases of every step laid end to end (max over ranks), one colour per phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(PHASES, plt.get_cmap("tab10").colors))
    fig, (ax, ax_mem) = plt.subplots(2, 1, figsize=(11, 5.5), height_ratios=[1, 1.4])
    t = 0.0
    for rec in records:
        for name in PHASES:
            ph = rec.get("phases", {}).get(name)
            if not ph or ph["seconds"] <= 0:
                continue
            ax.barh(0, ph["seconds"], left=t, color=colours[name], edgecolor="none")
            t += ph["seconds"]
    ax.set_yticks([])
    ax.set_xlabel("seconds (phases end to end; each is the slowest rank's time)")
    ax.set_title("Phase timeline")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in PHASES]
    ax.legend(handles, PHASES, ncol=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    for name in PHASES:
        ran = [
            (r["step"], r["phases"][name]["mem_gib"])
            for r in records
            if r.get("phases", {}).get(name, {}).get("seconds", 0.0) > 0
        ]
        if ran:
            xs, ys = zip(*ran)
            ax_mem.plot(xs, ys, marker=".", color=colours[name], label=name)
    ax_mem.set_xlabel("step")
    ax_mem.set_ylabel("peak memory, GiB (max over ranks)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
