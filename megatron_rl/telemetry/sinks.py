"""Where step records go: a JSONL file, Weights & Biases and a progress bar (pictures: plots.py).

Only rank 0 writes (the records already hold the max over ranks). W&B runs offline when no API key
is configured, respects WANDB_MODE (offline / disabled / online), and groups runs by recipe name.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO


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

    def figure(self, name: str, png: Path) -> None:
        """A picture of the run (the timeline) as a W&B media panel, next to the metrics."""
        import wandb

        self.run.log({f"figures/{name}": wandb.Image(str(png))})

    def close(self) -> None:
        self.run.finish()


class Progress:
    """A tqdm bar over steps showing reward, the share of completions that ended at a stop id (0 with
    every completion at the length cap: the engine does not know the model's end ids) and the phase
    now running."""

    def __init__(self, total: int, enabled: bool = True, initial: int = 0, file: TextIO | None = None):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=not enabled,
            desc="grpo",
            unit="step",
            file=file if file is not None else sys.stderr,
            dynamic_ncols=True,
        )

    def phase(self, name: str) -> None:
        self.bar.set_postfix_str(f"phase={name}", refresh=True)

    def step(self, record: dict) -> None:
        r = record.get("reward", {}).get("mean", float("nan"))
        stop = record.get("stop_fraction")
        self.bar.set_description(f"grpo reward={r:.3f}" + (f" stop={stop:.2f}" if stop is not None else ""))
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
