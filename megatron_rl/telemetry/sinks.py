"""Where step records go: a JSONL file, Weights & Biases and a progress bar (pictures: plots.py).

Only rank 0 writes (the records already hold the max over ranks). W&B runs offline when no API key
is configured, respects WANDB_MODE (offline / disabled / online), and groups runs by recipe name. A run
resumed from a checkpoint continues the W&B run it started (the id its checkpoint keeps), so a run is one
W&B run however often it is requeued; offline, each start writes a folder of that id under
`<run dir>/wandb/`, and `wandb sync <run dir>/wandb` uploads them in order into that one run. In W&B the
reward statuses are shares of the step's samples, every status each step (0 when absent), so a chart of
one does not break off; steps.jsonl keeps the counts.
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
    """W&B logging; offline without an API key, nothing at all with WANDB_MODE=disabled.

    `run_id`: the W&B run to continue (a resumed run's, from its checkpoint), else a new one.
    `statuses`: every reward status, logged as shares of each step's samples."""

    def __init__(
        self,
        project: str,
        group: str,
        name: str,
        run_dir: Path,
        config: dict,
        run_id: str | None = None,
        statuses: tuple[str, ...] = (),
    ):
        import wandb

        mode = os.environ.get("WANDB_MODE")
        self.why = f"WANDB_MODE={mode}"
        if mode is None:
            has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").exists()
            mode = "online" if has_key else "offline"
            self.why = "no API key here: `wandb login` or WANDB_API_KEY"
        self.run = wandb.init(
            project=project,
            group=group,
            name=name,
            dir=str(run_dir),
            mode=mode,
            config=config,
            reinit="finish_previous",
            id=run_id,
            resume="allow" if run_id else None,
        )
        self.mode, self.statuses = mode, tuple(statuses)
        self.id = self.run.id
        self.sync_command = f"wandb sync {run_dir / 'wandb'}"

    def write(self, record: dict, samples: list[dict] | None = None) -> None:
        """The step's record, flat, and the step's kept samples as a table (`samples`, W&B's media panel)."""
        import wandb

        flat = flatten({k: v for k, v in record.items() if k != "step"})
        counts = (record.get("reward") or {}).get("statuses")
        if isinstance(counts, dict) and self.statuses:
            total = sum(counts.values()) or 1
            flat = {k: v for k, v in flat.items() if not k.startswith("reward/statuses/")}
            flat.update({f"reward/statuses/{s}": counts.get(s, 0) / total for s in self.statuses})
        if samples:
            columns = list(samples[0])
            flat["samples"] = wandb.Table(
                columns=columns, data=[[row.get(c) for c in columns] for row in samples]
            )
        self.run.log(flat, step=record["step"])

    def figure(self, name: str, png: Path) -> None:
        """A picture of the run (the timeline) as a W&B media panel, next to the metrics."""
        import wandb

        self.run.log({f"figures/{name}": wandb.Image(str(png))})

    def close(self) -> None:
        self.run.finish()


class Progress:
    """A tqdm bar over steps showing reward, the gradient norm, the share of completions that ended at a
    stop id (0 with every completion at the length cap: the engine does not know the model's end ids),
    the two most frequent reward statuses (no_code=100%: nothing to run) and the phase now running."""

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        initial: int = 0,
        file: TextIO | None = None,
        name: str = "grpo",
    ):
        from tqdm import tqdm

        self.name = name  # the algorithm's (algorithm.name)
        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=not enabled,
            desc=name,
            unit="step",
            file=file if file is not None else sys.stderr,
            dynamic_ncols=True,
        )

    def phase(self, name: str) -> None:
        self.bar.set_postfix_str(f"phase={name}", refresh=True)

    def step(self, record: dict) -> None:
        from megatron_rl.telemetry.report import percent, status_shares

        r = record.get("reward", {}).get("mean", float("nan"))
        parts = [f"{self.name} reward={r:.3f}"]
        grad = (record.get("train") or {}).get("grad_norm")
        if grad is not None:
            parts.append(f"gnorm={grad:.3g}")
        if (
            record.get("value_loss") is not None
        ):  # PPO: the critic's loss and how much of the returns it explains
            parts.append(
                f"vloss={record['value_loss']:.3g} ev={record.get('explained_variance', float('nan')):.2f}"
            )
        stop = record.get("stop_fraction")
        if stop is not None:
            parts.append(f"stop={stop:.2f}")
        if (record.get("turns_max") or 0) > 1:  # multi-turn: turns per trajectory, solved after feedback
            parts.append(
                f"turns={record['turns_mean']:.2f} fixed={percent(record.get('solved_after_feedback', 0.0))}"
            )
        parts += [f"{k}={percent(v)}" for k, v in list(status_shares([record]).items())[:2]]
        self.bar.set_description(" ".join(parts))
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
