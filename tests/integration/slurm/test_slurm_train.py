"""The tiny recipe trained through `megatron-rl submit`, as a user submits it: 2 tasks on one node, one
rank each (srun, no torchrun), real trainer, engines and rewards, scored by the job's own reward fleet: a
heterogeneous job whose second component runs a reward-server on node cpu01 of the `cpu` partition.
Checks the job's exit and both components', its log and the step records the run writes under
`<logger.run_dir>/<recipe>-<job id>/`, and that the fleet scored every sample once."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[3]
STEPS = 2


def test_tiny_recipe_trains_through_submit_scored_by_its_own_fleet(slurm, tmp_path):
    overrides = [
        f"steps={STEPS}",
        f"logger.run_dir={tmp_path / 'outputs'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "logger.progress=false",
        "reward.fleet_nodes=1",
        "reward.fleet_cpus_per_node=2",  # cpu01: a second slurmd on this 2-CPU machine
        "reward.fleet_partition=cpu",
        "reward.timeout_s=9",  # neither the recipe's nor the server's default: it scores as the recipe says
    ]
    cli = [sys.executable, "-m", "megatron_rl.cli", "submit", "grpo_tiny_cpu", *overrides]
    out = slurm.run([*cli, f"--log-dir={tmp_path}"], cwd=REPO, env={"WANDB_MODE": "offline"}).stdout
    command, submitted = out.strip().splitlines()
    assert " : --nodes=1 --ntasks-per-node=1 --cpus-per-task=2 --exclusive" in command, command
    job_id = re.fullmatch(r"submitted job (\d+);.*", submitted).group(1)
    job = slurm.wait(job_id, timeout=1200)
    log = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log[-8000:]
    fleet = slurm.components(job_id)[1]
    assert (fleet["Partition"], fleet["NodeList"], fleet["JobState"]) == ("cpu", "cpu01", "COMPLETED")
    assert "launcher srun" in log and f"megatron-rl job {job_id} done, exit code 0" in log

    run_dir = tmp_path / "outputs" / f"grpo_tiny_cpu-{job_id}"  # the run is named after the job
    records = [
        json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines() if line.strip()
    ]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), log[-4000:]
    for r in records:
        assert r["phases"]["generation"]["seconds"] > 0 and r["phases"]["train_fwd_bwd"]["seconds"] > 0
        assert len(r["phases"]["generation"]["seconds_by_rank"]) == 2, "both srun tasks joined the run"
        assert r["scoring"]["remote_retries"] == 0, "one server on loopback: nothing sent twice"

    # The ranks started once the server listened, scored through it, and it stopped with the job.
    listening = re.search(r"== reward fleet: 1 of 1 server\(s\) listening: (\S+:\d+)", log)
    assert listening, log[-4000:]
    samples = sum(sum(r["reward"]["statuses"].values()) for r in records)
    assert f"reward-server on {listening.group(1)} stopped after scoring {samples} samples" in log, log[
        -4000:
    ]
    assert log.index("reward fleet: 1 of 1") < log.index("megatron-rl train grpo_tiny_cpu")
    # Both tasks were measured first, against the recipe's (CPU) cluster figures, and passed.
    preflight = log.index("megatron-rl preflight: 1 node(s), 2 rank(s), cluster cpu_2core")
    assert preflight < log.index("megatron-rl train grpo_tiny_cpu"), log[-4000:]
    verdict = json.loads(re.search(r"^PREFLIGHT (.*)$", log, re.M).group(1))
    assert verdict["passed"] and verdict["nodes"][0]["host"] == job["NodeList"], verdict
    assert not (REPO / ".megatron-rl-fleet").exists(), "the fleet's endpoint files go with the job"


def test_a_fleet_that_cannot_start_stops_the_job_before_any_rank(slurm, tmp_path):
    """A token the servers refuse (too short): the fleet ends at once, and the job with it, exit 1."""
    fleet = ["reward.fleet_nodes=1", "reward.fleet_cpus_per_node=2", "reward.fleet_partition=cpu"]
    cli = [
        sys.executable,
        "-m",
        "megatron_rl.cli",
        "submit",
        "grpo_tiny_cpu",
        *fleet,
        f"--log-dir={tmp_path}",
    ]
    out = slurm.run(cli, cwd=REPO, env={"MEGATRON_RL_REWARD_TOKEN": "short"}).stdout
    job_id = re.search(r"submitted job (\d+);", out).group(1)
    job = slurm.wait(job_id, timeout=300)
    log = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "1:0"), log[-4000:]
    assert "MEGATRON_RL_REWARD_TOKEN is 5 characters; use at least 16" in log, log[-4000:]
    assert "the reward fleet ended (exit 2) with 0 of 1 server(s) listening: no rank started" in log
    assert "megatron-rl train" not in log and not (REPO / ".megatron-rl-fleet").exists()
