"""Run-level plumbing: process groups, the run directory, seeds, telemetry sinks, step records.

Kept out of `train.py` so the driver reads as the algorithm. Rank 0 owns the sinks (JSONL, W&B,
progress bar, timeline plot); every rank times its phases and joins the MAX reduction per step.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from megatron_rl.telemetry.phases import PHASES, PhaseTimer, reduce_over_ranks
from megatron_rl.telemetry.sinks import JsonlWriter, Progress, WandbSink, plot_timeline
from megatron_rl.trainer.parallel import ParallelState, init_parallel

log = logging.getLogger("megatron_rl")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_name(recipe) -> str:
    job = os.environ.get("SLURM_JOB_ID")
    return os.environ.get("MEGATRON_RL_RUN_NAME") or (f"{recipe.name}-{job}" if job else recipe.name)


class Run:
    """One training run as seen from one rank."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.state: ParallelState = init_parallel(recipe.layout.tp, recipe.layout.pp, seed=recipe.seed)
        self.rank = self.state.env.rank
        self.is_main = self.rank == 0
        self.name = run_name(recipe)
        self.dir = Path(recipe.logger.run_dir) / self.name
        self.timer = PhaseTimer()
        from megatron.core import parallel_state as ps

        self.dp_group = ps.get_data_parallel_group()
        self.records: list[dict] = []
        self.switch_memory: dict[str, dict[str, float]] = {}
        # Telemetry reductions run on CPU tensors: a gloo group works under NCCL too.
        self.cpu_group = dist.new_group(backend="gloo") if self.state.device.type == "cuda" else None
        self.jsonl = self.wandb = self.progress = None
        logging.basicConfig(
            level=logging.INFO if self.is_main else logging.WARNING,
            format=f"[rank{self.rank}] %(asctime)s %(name)s: %(message)s",
        )
        if self.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1, default=str))
            self.jsonl = JsonlWriter(self.dir / "steps.jsonl")
            if recipe.logger.wandb:
                group = recipe.logger.group or recipe.name
                self.wandb = WandbSink(recipe.logger.project, group, self.name, self.dir, asdict(recipe))
        dist.barrier()

    def note_memory(self, switch: str, snapshot: dict[str, float]) -> None:
        """Memory at each time-sharing switch (trainer offloaded, engine asleep, ...), for the step record."""
        self.switch_memory[switch] = snapshot

    def start_progress(self, first_step: int) -> None:
        if self.is_main:
            self.progress = Progress(self.recipe.steps, self.recipe.logger.progress, initial=first_step)

    def phase(self, name: str):
        if self.progress is not None:
            self.progress.phase(name)
        return self.timer.phase(name)

    def record(self, step: int, metrics: dict) -> dict:
        """Reduce this step's phase stats over ranks (MAX) and write the record (rank 0)."""
        phases = reduce_over_ranks(self.timer.take(), PHASES, group=self.cpu_group)
        record = {"step": step, "phases": phases, **metrics, "timeshare_memory": self.switch_memory}
        self.switch_memory = {}
        record["step_seconds"] = sum(p["seconds"] for p in phases.values())
        if self.is_main:
            self.records.append(record)
            self.jsonl.write(record)
            if self.wandb:
                self.wandb.write(record)
            if self.progress:
                self.progress.step(record)
        return record

    def finish(self) -> None:
        if self.is_main:
            if self.progress:
                self.progress.close()
            if self.records:
                plot_timeline(self.records, self.dir / "timeline.png")
            if self.wandb:
                self.wandb.close()
            self.jsonl.close()
