"""Run-level plumbing: process groups, the run directory, seeds, console, telemetry sinks, step records.

Kept out of `train.py` so the driver reads as the algorithm. Rank 0 owns the sinks (JSONL, W&B,
progress bar, timeline plot); every rank times its phases and joins the MAX reduction per step.
Every rank's output goes to `<run dir>/log.txt` from the start (telemetry/console.py); the terminal
gets a header, the progress bar, our warnings, errors and the closing summary.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from megatron_rl.layout import ParallelLayout
from megatron_rl.loop.names import run_name
from megatron_rl.loop.summary import reward_stats
from megatron_rl.telemetry import console
from megatron_rl.telemetry.phases import PHASES, PhaseTimer, gather_spans, reduce_over_ranks
from megatron_rl.telemetry.sinks import JsonlWriter, Progress, WandbSink
from megatron_rl.trainer.parallel import ParallelState, init_parallel

log = logging.getLogger("megatron_rl")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def header(recipe, run_dir: Path) -> str:
    """The first lines a user sees: what runs, on which layout, and where its outputs go."""
    lay, ro = recipe.layout, recipe.rollout
    procs = lay.tp * lay.pp * lay.dp * lay.cp
    if lay.placement == "separated":
        procs += lay.engine_tp * lay.engine_count
    return "\n".join(
        [
            f"megatron-rl train {recipe.name}: {recipe.steps} steps of {recipe.data.prompts_per_step} prompts "
            f"x {ro.samples_per_prompt} samples",
            f"  layout   trainer TP{lay.tp} x PP{lay.pp} x DP{lay.dp} on {procs} processes; "
            f"engines {lay.engine_count} x TP{lay.engine_tp}, {lay.placement}",
            f"  outputs  {run_dir}/ (log.txt: every rank's full output; steps.jsonl; spans.jsonl; timeline.png)",
            "  starting trainer, reference, engines and reward pool (details in log.txt) ...",
        ]
    )


def _rank_from_env() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


class Run:
    """One training run as seen from one rank."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.name = run_name(recipe)
        self.dir = Path(recipe.logger.run_dir) / self.name
        # Before anything is built: a fresh start over an earlier run's checkpoints would mix the runs.
        from megatron_rl.checkpoint.store import fresh_start_conflict

        conflict = fresh_start_conflict(recipe.checkpoint.resume, Path(recipe.checkpoint.dir) / self.name)
        if conflict:
            raise SystemExit(f"error: {conflict}")
        # Before anything loads megatron-core or vLLM: their output goes to log.txt from the first line.
        self.console = console.start(self.dir / "log.txt", _rank_from_env())
        if self.console.rank == 0:
            self.console.say(header(recipe, self.dir))
        self.layout = ParallelLayout.from_config(recipe.layout)
        self.state: ParallelState = init_parallel(
            self.layout, seed=recipe.seed, timeout_s=recipe.cluster.dist_timeout_s
        )
        self.rank = self.state.env.rank
        self.is_main = self.rank == 0
        self.timer = PhaseTimer()
        from megatron.core import parallel_state as ps

        self.dp_group = ps.get_data_parallel_group()
        self.records: list[dict] = []
        self.switch_memory: dict[str, dict[str, float]] = {}
        self.switch_times: dict[str, float] = {}
        # Telemetry reductions run on CPU tensors: the explicit gloo group (NCCL refuses host tensors).
        self.cpu_group = self.state.cpu_group
        self.jsonl = self.spans = self.wandb = self.progress = None
        # The console's copy into log.txt adds the rank to every line.
        logging.basicConfig(
            level=logging.INFO if self.is_main else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        )
        if self.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1, default=str))
            self.jsonl = JsonlWriter(self.dir / "steps.jsonl")
            # Every rank's phase spans (for `report --trace`) apart: a line per step grows with the ranks.
            self.spans = JsonlWriter(self.dir / "spans.jsonl")
            if recipe.logger.wandb:
                group = recipe.logger.group or recipe.name
                self.wandb = WandbSink(recipe.logger.project, group, self.name, self.dir, asdict(recipe))
        dist.barrier()

    def note_memory(self, switch: str, snapshot: dict[str, float]) -> None:
        """Memory and time at each time-sharing switch (trainer offloaded, engine asleep, ...).

        The times give the seconds the device spends switching between trainer and engine (see
        `switch_seconds`); the memory goes into the step record as it is."""
        self.switch_memory[switch] = snapshot
        self.switch_times[switch] = time.perf_counter()

    def say(self, text: str) -> None:
        """A message for the user's terminal (rank 0), also kept in log.txt."""
        if self.is_main:
            self.console.say(text)

    def start_progress(self, first_step: int) -> None:
        if self.is_main:
            self.progress = Progress(
                self.recipe.steps, self.recipe.logger.progress, initial=first_step, file=self.console.terminal
            )
            self.timer.on_enter = self.progress.phase  # also the phases timed inside components

    def phase(self, name: str):
        return self.timer.phase(name)

    def record(self, step: int, metrics: dict) -> dict:
        """Reduce this step's phase stats over ranks (MAX) and write the record (rank 0)."""
        phases = reduce_over_ranks(self.timer.take(), PHASES, group=self.cpu_group)
        spans = gather_spans(self.timer.take_spans(), group=self.cpu_group)
        record = {"step": step, "phases": phases, **metrics, "timeshare_memory": self.switch_memory}
        record["switch_seconds"] = switch_seconds(self.switch_times)
        self.switch_memory, self.switch_times = {}, {}
        record["step_seconds"] = sum(p["seconds"] for p in phases.values())
        if self.is_main:
            self.records.append(record)
            self.jsonl.write(record)
            self.spans.write({"step": step, "spans_by_rank": spans})
            if self.wandb:
                self.wandb.write(record)
            if self.progress:
                self.progress.step(record)
        return record

    def finish(self) -> None:
        """Close the sinks; rank 0 draws the timeline and prints the reward line and the per-phase table."""
        if self.is_main:
            if self.progress:
                self.progress.close()
                self.timer.on_enter = None
            if self.records:
                from megatron_rl.telemetry.plots import plot_timeline
                from megatron_rl.telemetry.report import phase_table

                png = plot_timeline(self.records, self.dir / "timeline.png")
                if self.wandb:
                    self.wandb.figure("timeline", png)
                self.say(reward_stats(self.records))
                self.say(phase_table(self.records))
                self.say(f"outputs in {self.dir}/; the full report: megatron-rl report {self.dir}")
            if self.wandb:
                self.wandb.close()
            self.jsonl.close()
            self.spans.close()


# Pairs of switch points (from, to) noted by the time-sharing; their gaps are the switch itself.
SWITCHES = (
    ("train_end", "trainer_offloaded"),
    ("published", "rollout_start"),
    ("rollout_end", "train_start"),
)


def switch_seconds(times: dict[str, float]) -> float:
    """Seconds this step spent handing the device between trainer and engine (offload, sleep, wake)."""
    return round(sum(times[b] - times[a] for a, b in SWITCHES if a in times and b in times), 6)
