"""Starting a run: seeds, the header, the process groups (processes.py) and the run's records (records.py).

Kept out of `train.py` so the driver reads as the algorithm. The order matters and lives here alone:
refuse a fresh start over an earlier run's checkpoints before anything is built; start the console
before anything loads megatron-core or vLLM (every rank's output goes to `<run dir>/log.txt` from the
first line; the terminal gets a header, the progress bar, our warnings, errors and the closing summary);
then the process groups, then the records' files, then a barrier.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from megatron_rl.loop.placement.processes import Processes
from megatron_rl.loop.record.names import run_name
from megatron_rl.loop.record.records import RunLog
from megatron_rl.parallel.dist_env import from_env
from megatron_rl.system.watchdog import Watchdog
from megatron_rl.telemetry import console


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def header(run, run_dir: Path) -> str:
    """The first lines a user sees: what runs, on which layout, and where its outputs go."""
    recipe, lay = run.recipe, run.layout
    ro = recipe.rollout
    procs = lay.gpus
    return "\n".join(
        [
            f"megatron-rl train {recipe.name}: {recipe.steps} step{'s' if recipe.steps != 1 else ''} of "
            f"{recipe.data.prompts_per_step} prompts "
            f"x {ro.samples_per_prompt} samples",
            f"  layout   trainer TP{lay.tp} x PP{lay.pp} x DP{lay.dp} on {procs} processes "
            f"(cluster {recipe.cluster.name}); "
            f"engines {lay.engine_count} x TP{lay.engine_tp}, {lay.placement}",
            f"  outputs  {run_dir}/ (log.txt: every rank's full output; steps.jsonl; samples.jsonl; spans.jsonl; "
            "timeline.png)",
            f"  run      {run_dir.name}: checkpoints in {Path(recipe.checkpoint.dir) / run_dir.name}/"
            + ("; a run of the same name resumes from them" if recipe.checkpoint.resume == "auto" else ""),
            "  starting trainer, reference, engines and reward pool (details in log.txt) ...",
        ]
    )


def start_run(run) -> tuple[Processes, RunLog]:
    """This rank's process groups and its records of the run (`run`: the resolved run, run/resolve.py).
    Collective: every rank calls it once."""
    recipe = run.recipe
    run_dir = Path(recipe.logger.run_dir) / run_name(recipe)
    # Before anything is built: a fresh start over an earlier run's checkpoints would mix the runs.
    from megatron_rl.checkpoint.store import fresh_start_conflict

    conflict = fresh_start_conflict(recipe.checkpoint.resume, Path(recipe.checkpoint.dir) / run_dir.name)
    if conflict:
        raise SystemExit(f"error: {conflict}")
    # Before anything loads megatron-core or vLLM: their output goes to log.txt from the first line.
    out = console.start(run_dir / "log.txt", from_env().rank)
    if out.rank == 0:
        out.say(header(run, run_dir))
    # From here no wait is endless: a heartbeat for the job's failover (its exit folder under Slurm) and an
    # end to a rank that makes no progress for cluster.dist_timeout_s (system/watchdog.py)
    beats = os.environ.get("MEGATRON_RL_EXIT_DIR")
    watchdog = Watchdog(
        recipe.cluster.dist_timeout_s,
        out.rank,
        Path(beats) if beats else None,
        on_stuck=lambda line: out.error(f"error: {line}"),
    )
    procs = Processes.start(run)
    runlog = RunLog(recipe, run_dir, out, procs.is_main, procs.cpu_group)
    runlog.watchdog = watchdog
    dist.barrier(group=procs.job_cpu_group)  # rank 0 has made the run directory and opened the sinks
    return procs, runlog
