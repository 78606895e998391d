"""The run's records: its directory, the console, phase timing, step records and their sinks.

Rank 0 owns the sinks (JSONL, W&B, progress bar, timeline plot, the kept samples); every rank times its
phases and joins the MAX reduction per step. Apart from the process groups (processes.py): a collector
needs the timer, the time-sharing its memory notes, and neither needs a process group.

W&B opens with the progress bar, once the run knows whether it resumed: a run resumed from its own
checkpoint continues the W&B run the checkpoint names (`identity`, kept in its run_state.json), one
started afresh, or from another run's checkpoint, opens a new one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path

from megatron_rl.loop.record.signal import SignalWatch
from megatron_rl.loop.record.summary import kept_samples
from megatron_rl.reward.result import STATUSES
from megatron_rl.telemetry.console import Console
from megatron_rl.telemetry.phases import PHASES, PhaseTimer, gather_spans, reduce_over_ranks
from megatron_rl.telemetry.sinks import JsonlWriter, Progress, WandbSink

log = logging.getLogger(__name__)


class RunLog:
    """What one rank records of the run, and where it goes.

    `run_dir` is `<logger.run_dir>/<run name>`; the console already writes its log.txt (it starts before
    megatron-core or vLLM load). `cpu_group` is the gloo group the per-step reductions run on: they
    reduce CPU tensors, which NCCL refuses."""

    def __init__(self, recipe, run_dir: Path, out: Console, is_main: bool, cpu_group) -> None:
        self.recipe = recipe
        self.name, self.dir = run_dir.name, run_dir
        self.console, self.is_main, self.cpu_group = out, is_main, cpu_group
        self.timer = PhaseTimer()
        self.timer.on_enter = self._entered  # also the phases timed inside components
        self.watchdog = None  # system/watchdog.py, set by start_run: each phase entered is progress
        self.records: list[dict] = []
        self.switch_memory: dict[str, dict[str, float]] = {}
        self.switch_times: dict[str, float] = {}
        self._last_record: float | None = None
        self.jsonl = self.spans = self.samples = self.wandb = self.progress = None
        self.wandb_id: str | None = None  # the W&B run a resumed checkpoint names, then this run's
        self.watch = SignalWatch(recipe.logger.no_signal_steps, str(run_dir / "samples.jsonl"))
        # The console's copy into log.txt adds the rank to every line.
        logging.basicConfig(
            level=logging.INFO if is_main else logging.WARNING,
            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        )
        if is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1, default=str))
            self.jsonl = JsonlWriter(self.dir / "steps.jsonl")
            # Every rank's phase spans (for `report --trace`) apart: a line per step grows with the ranks.
            self.spans = JsonlWriter(self.dir / "spans.jsonl")
            self.samples = JsonlWriter(self.dir / "samples.jsonl")  # a few completions per step, to read

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

    def identity(self) -> dict:
        """What a checkpoint keeps of the run's records: its name and its W&B run, which a resume continues."""
        return {"name": self.name, "wandb_id": self.wandb.id if self.wandb else self.wandb_id}

    def resumed(self, saved: dict | None) -> None:
        """The `identity` a resumed checkpoint kept: its W&B run is continued when the checkpoint is this
        run's own (same name); another run's checkpoint (checkpoint.resume=PATH) starts a W&B run of its own."""
        if saved and saved.get("name") == self.name:
            self.wandb_id = saved.get("wandb_id")

    def start_progress(self, first_step: int) -> None:
        """The progress bar and W&B, from `first_step` (0, or the step a checkpoint resumed at)."""
        self._last_record = time.perf_counter()
        if self.is_main and self.recipe.logger.wandb:
            self._open_wandb(continued=first_step > 0)
        if self.is_main:
            self.progress = Progress(
                self.recipe.steps,
                self.recipe.logger.progress,
                initial=first_step,
                file=self.console.terminal,
                name=self.recipe.algorithm.name,
            )

    def _entered(self, phase: str) -> None:
        if self.watchdog is not None:
            self.watchdog.progress(phase)
        if self.progress is not None:
            self.progress.phase(phase)

    def _open_wandb(self, continued: bool) -> None:
        lg = self.recipe.logger
        run_id = self.wandb_id if continued else None
        self.wandb = WandbSink(
            lg.project,
            lg.group or self.recipe.name,
            self.name,
            self.dir,
            asdict(self.recipe),
            run_id,
            STATUSES,
        )
        w = self.wandb
        which = f"continues run {run_id}" if run_id else f"run {w.id}"
        if w.mode == "offline":
            self.say(f"W&B {which}, offline ({w.why}); upload it later with: {w.sync_command}")
        elif w.mode == "online":
            self.say(f"W&B {which}: {w.run.url}")

    def phase(self, name: str) -> AbstractContextManager:
        return self.timer.phase(name)

    def record(self, step: int, metrics: dict, samples: Sequence = (), task=None) -> dict:
        """Reduce this step's phase stats over ranks (MAX) and write the record (rank 0), with a few of the
        step's `samples` decoded by `task` (logger.samples_per_step) to samples.jsonl and W&B. Collective."""
        phases = reduce_over_ranks(self.timer.take(), PHASES, group=self.cpu_group)
        spans = gather_spans(self.timer.take_spans(), cpu_group=self.cpu_group)
        record = {"step": step, "phases": phases, **metrics, "timeshare_memory": self.switch_memory}
        record["switch_seconds"] = switch_seconds(self.switch_times)
        self.switch_memory, self.switch_times = {}, {}
        record["step_seconds"] = sum(p["seconds"] for p in phases.values())
        # Wall time since the previous step ended: the step time when phases overlap (separated, async),
        # where the sum of phase maxima above counts the overlapped seconds twice.
        now = time.perf_counter()
        if self._last_record is not None:
            record["wall_seconds"] = round(now - self._last_record, 6)
        self._last_record = now
        if self.is_main:
            self.records.append(record)
            self.jsonl.write(record)
            self.spans.write({"step": step, "spans_by_rank": spans})
            kept = (
                kept_samples(step, list(samples), task, self.recipe.logger.samples_per_step) if task else []
            )
            for row in kept:
                self.samples.write(row)
            if self.wandb:
                self.wandb.write(record, kept)
            if self.progress:
                self.progress.step(record)
            said = self.watch.see(record)
            if said:
                log.warning(said)
        return record

    def finish(self) -> None:
        """Close the sinks; rank 0 draws the timeline and prints the reward line and the per-phase table."""
        if self.is_main:
            if self.progress:
                self.progress.close()
                self.progress = None
            if self.records:
                from megatron_rl.telemetry.plots import plot_timeline
                from megatron_rl.telemetry.report import closing_lines

                png = plot_timeline(self.records, self.dir / "timeline.png")
                if self.wandb:
                    self.wandb.figure("timeline", png)
                self.say(closing_lines(self.records))
                self.say(f"outputs in {self.dir}/; the full report: megatron-rl report {self.dir}")
            if self.wandb:
                self.wandb.close()
                if self.wandb.mode == "offline":
                    self.say(f"W&B ran offline; upload it with: {self.wandb.sync_command}")
            self.jsonl.close()
            self.spans.close()
            self.samples.close()


# Pairs of switch points (from, to) noted by the time-sharing; their gaps are the switch itself.
SWITCHES = (
    ("train_end", "trainer_offloaded"),
    ("published", "rollout_start"),
    ("rollout_end", "train_start"),
)


def switch_seconds(times: dict[str, float]) -> float:
    """Seconds this step spent handing the device between trainer and engine (offload, sleep, wake)."""
    return round(sum(times[b] - times[a] for a, b in SWITCHES if a in times and b in times), 6)
