"""A run that loses two nodes and finishes on its spares, inside one job: the tiny recipe on separated
pools (the trainer on one node, its vLLM engine on the other) on 2 of the 4 one-GPU nodes of the local
`sim` partition (cluster.spare_nodes=2), through `megatron-rl submit`.

First the engine's rank is killed with kill -9 (an engine that crashes with its node); the job blames that
node from the rank's exit record, starts a new job step on a spare and the run resumes from its newest
checkpoint. Then the replacement engine rank is stopped with SIGSTOP (a node that hangs: nothing exits,
nothing answers): the trainer waits in a collective until cluster.dist_timeout_s, ends with the
lost-peer code, and the job blames the node whose heartbeat stopped, not the rank that reported it. The run finishes on the second spare with
every step recorded, and the job completes with exit 0. The times from each fault to the restart are
printed (the README's figures come from benchmarks/recovery.py --spares)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[3]
STEPS = 10
RECIPE = "grpo_tiny_cpu_separated"  # rank 0 trains, rank 1 generates
RUN = [
    "cluster.nodes=2",
    "cluster.gpus_per_node=1",
    "cluster.spare_nodes=2",
    "cluster.partition=sim",
    "cluster.dist_timeout_s=60",  # the shortest a recipe may set: the hung node costs a minute
    "checkpoint.interval=1",
    "logger.progress=false",
    "logger.wandb=false",
]


def _beat(job_id: str, rank: int) -> dict | None:
    f = REPO / ".megatron-rl-exit" / job_id / f"beat.rank{rank}"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def _steps(run_dir: Path) -> list[int]:
    f = run_dir / "steps.jsonl"
    lines = f.read_text().splitlines() if f.exists() else []
    return [json.loads(x)["step"] for x in lines if x.strip()]


def _saved(run_dir: Path) -> int:
    """Checkpoints the run has completed, over all its starts (its log.txt says so of each)."""
    f = run_dir / "log.txt"
    return f.read_text().count(" complete in ") if f.exists() else 0


def _until(what: str, check, slurm, job_id: str, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        job = slurm.job(job_id)
        if job["JobState"] not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise AssertionError(
                f"job ended ({job['JobState']}) while waiting for {what}:\n{slurm.log(job)[-6000:]}"
            )
        time.sleep(0.2)
    slurm.run(["scancel", job_id], check=False)
    raise AssertionError(f"no {what} after {timeout} s:\n{slurm.log(slurm.job(job_id))[-6000:]}")


def test_a_killed_and_a_hung_node_are_replaced_by_spares(slurm, tmp_path):
    overrides = [
        *RUN,
        f"steps={STEPS}",
        f"logger.run_dir={tmp_path / 'out'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
    ]
    cli = [
        sys.executable,
        "-m",
        "megatron_rl.cli",
        "submit",
        RECIPE,
        *overrides,
        f"--log-dir={tmp_path}",
    ]
    out = slurm.run(cli, cwd=REPO).stdout
    assert "--nodes=4 " in out, out  # the run's 2 nodes and 2 spares
    job_id = re.search(r"submitted job (\d+)", out).group(1)
    run_dir = tmp_path / "out" / f"{RECIPE}-{job_id}"
    log = lambda: slurm.log(slurm.job(job_id))  # noqa: E731

    # 1. The engine's node dies: kill -9 rank 1 (on sim02) once the run has a checkpoint and is in its next steps.
    _until("step 2 and a checkpoint", lambda: len(_steps(run_dir)) >= 2 and _saved(run_dir), slurm, job_id)
    first = _beat(job_id, 1)
    assert first and first["host"] == "sim02", first
    os.kill(first["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    _until("the first restart", lambda: "== restart 1 of 3" in log(), slurm, job_id, timeout=120)
    kill_restart_s = time.monotonic() - killed_at
    recorded, saved = len(_steps(run_dir)), _saved(run_dir)  # the killed start's: the restart's come after

    # 2. Its spare hangs: the engine's rank, now on sim03, stopped (a SIGSTOP'd process beats no more and answers nothing).
    second = _until(
        "rank 1 on the spare",
        lambda: (b := _beat(job_id, 1)) and b["host"] == "sim03" and b["pid"] != first["pid"] and b,
        slurm,
        job_id,
    )
    _until(
        "a step and a checkpoint on the spare",
        lambda: len(_steps(run_dir)) > recorded and _saved(run_dir) > saved,
        slurm,
        job_id,
    )
    os.kill(second["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    _until("the second restart", lambda: "== restart 2 of 3" in log(), slurm, job_id, timeout=240)
    hang_restart_s = time.monotonic() - stopped_at

    job = slurm.wait(job_id, timeout=600)
    text = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), text[-8000:]
    print(
        f"\nkill -9 -> restart on a spare: {kill_restart_s:.1f} s; SIGSTOP -> restart: {hang_restart_s:.1f} s"
    )

    # The killed node was blamed by its rank's exit record, the hung one by its heartbeat, and the trainer that
    # reported the hang (rank 0, exit 76) was not blamed: sim01 ran every step.
    assert "== node sim02 failed: rank 1 was killed by SIGKILL" in text, text[-8000:]
    assert re.search(
        r"== node sim03 failed: rank 1 \(pid \d+\) stopped beating in phase \S+ \d+ s before the (others|first failure): hung",
        text,
    ), text[-8000:]
    assert "node sim01 failed" not in text
    # rank 0's one line: its collective timed out, or its watchdog saw no progress for dist_timeout_s first
    assert "lost a peer rank at a collective" in text or "rank 0 made no progress for" in text, text[-8000:]
    assert "== restart 1 of 3: the run goes on from its newest checkpoint on sim01,sim03" in text
    assert "== restart 2 of 3: the run goes on from its newest checkpoint on sim01,sim04" in text
    assert text.count("resumed from") >= 2, text[-8000:]
    assert "exit code 0" in text.splitlines()[-1]
    # Every step recorded, the last start's records ending at the last step; nothing of the job left behind.
    steps = _steps(run_dir)
    assert set(steps) == set(range(1, STEPS + 1)) and steps[-1] == STEPS, steps
    assert (
        not (REPO / ".megatron-rl-exit" / job_id).exists()
        and not (REPO / ".megatron-rl-exit" / f"{job_id}.bad").exists()
    )
