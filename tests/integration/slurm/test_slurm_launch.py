"""slurm/train.sbatch on a real Slurm: ranks over `srun -n2` and over one torchrun per node, SIGUSR1
before the time limit, the first failing rank's exit code, requeue on exit 75.

The ranks run launch/check_dist.py (MEGATRON_RL_ENTRY), which joins a gloo process group and checks
the rank numbering with an all_reduce: seconds per job instead of a training run's minutes.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[3]
SBATCH = str(REPO / "slurm" / "train.sbatch")
CHECK = str(REPO / "launch" / "check_dist.py")
TWO_RANKS = ["--nodes=1", "--gpus-per-node=2", "--ntasks-per-node=2", "--time=5"]


def report(log: str) -> dict:
    lines = [line for line in log.splitlines() if line.startswith("CHECK_DIST ")]
    assert len(lines) == 1, f"expected one CHECK_DIST line in the job log:\n{log}"
    return json.loads(lines[0].removeprefix("CHECK_DIST "))


def rank_map(rep: dict) -> list[tuple]:
    return sorted((r["rank"], r["local_rank"], r["local_world"], r["world"]) for r in rep["ranks"])


def test_submit_runs_one_rank_per_gpu_and_delivers_usr1(slurm, tmp_path):
    """`megatron-rl submit` for real; with a 2-minute limit the script's own `--signal=USR1@120` is due at
    once and arrives at the controller's next time-limit check (every ~30 s). Named, the job's ranks get
    the run's name (the job continues the local run of that name)."""
    env = {"MEGATRON_RL_ENTRY": CHECK, "MEGATRON_RL_CHECK_WAIT_USR1": "75", "MEGATRON_RL_RUN_NAME": "mine"}
    cmd = [sys.executable, "-m", "megatron_rl.cli", "submit", "grpo_tiny_cpu", "cluster.time_limit=2"]
    done = slurm.run(cmd, cwd=tmp_path, env=env)
    out = done.stdout
    assert "MEGATRON_RL_RUN_NAME=mine" in out.splitlines()[0], "the printed command carries the name"
    assert "run mine (MEGATRON_RL_RUN_NAME): continues from its newest checkpoint" in done.stderr
    job_id = re.search(r"submitted job (\d+)", out).group(1)
    job = slurm.wait(job_id, timeout=150)
    log = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert Path(job["StdOut"]) == tmp_path / "logs" / f"grpo_tiny_cpu-{job_id}.log"
    rep = report(log)
    assert rep["problems"] == [] and rep["world"] == rep["recipe_world"] == 2
    assert rank_map(rep) == [(0, 0, 2, 2), (1, 1, 2, 2)]
    ranks = sorted(rep["ranks"], key=lambda r: r["rank"])
    assert [r["slurm_procid"] for r in ranks] == ["0", "1"], "one srun task per rank"
    assert len({r["pid"] for r in ranks}) == 2 and len({r["master"] for r in ranks}) == 1
    assert all(r["usr1_after_s"] is not None for r in ranks), "every rank got SIGUSR1 and survived it"
    assert all(r["omp_threads"] == "1" and r["cuda_visible_devices"] == "0,1" for r in ranks)
    assert all(r["slurm_job_id"] == job_id and r["slurm_job_name"] == "grpo_tiny_cpu" for r in ranks)
    assert all(r["run_name"] == "mine" for r in ranks)
    assert "launcher srun" in log and f"megatron-rl job {job_id} done, exit code 0" in log
    assert out.rstrip().endswith("; run mine")


def test_submit_places_both_pools_of_a_separated_recipe(slurm, tmp_path):
    """Separated: the job holds the trainer's ranks and then the engines' (1 + 1 here), one task each."""
    env = {"MEGATRON_RL_ENTRY": CHECK}
    cmd = [
        sys.executable,
        "-m",
        "megatron_rl.cli",
        "submit",
        "grpo_tiny_cpu_separated",
        "cluster.time_limit=5",
    ]
    out = slurm.run(cmd, cwd=tmp_path, env=env).stdout
    job_id = re.search(r"submitted job (\d+)", out).group(1)
    job = slurm.wait(job_id, timeout=120)
    log = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log
    rep = report(log)
    assert rep["problems"] == [] and rep["world"] == rep["recipe_world"] == 2
    assert rep["roles"] == ["trainer", "engine"]
    assert sorted(r["slurm_procid"] for r in rep["ranks"]) == ["0", "1"]


def test_torchrun_per_node_gives_the_same_ranks_and_survives_usr1(slurm, tmp_path):
    env = {"MEGATRON_RL_ENTRY": CHECK, "LAUNCHER": "torchrun", "MEGATRON_RL_CHECK_WAIT_USR1": "60"}
    job_id = slurm.sbatch([*TWO_RANKS, "--output=%x-%j.log", SBATCH, "grpo_tiny_cpu"], cwd=tmp_path, env=env)
    log_path = tmp_path / f"megatron-rl-{job_id}.log"
    deadline = time.monotonic() + 90
    while log_path.read_text().count("waiting up to") < 2 if log_path.exists() else True:
        assert time.monotonic() < deadline, log_path.read_text() if log_path.exists() else "no log"
        time.sleep(0.3)
    # What `--signal=USR1@120` does: signal every process of the job's steps (the torchrun agent too).
    slurm.run(["scancel", "--signal=USR1", job_id])
    job = slurm.wait(job_id, timeout=60)
    log = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log
    rep = report(log)
    assert rep["problems"] == [] and rank_map(rep) == [(0, 0, 2, 2), (1, 1, 2, 2)], "same map as srun"
    assert {r["slurm_procid"] for r in rep["ranks"]} == {"0"}, "one srun task (the agent) per node"
    assert all(r["usr1_after_s"] is not None for r in rep["ranks"])
    assert "launcher torchrun" in log


def test_first_failing_rank_sets_the_job_exit_code(slurm, tmp_path):
    entry = tmp_path / "fail_on_rank1.py"
    entry.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(1)\n    sys.exit(7)\n"
        "time.sleep(120)\n"
    )
    job_id = slurm.sbatch(
        [*TWO_RANKS, SBATCH, "grpo_tiny_cpu"], cwd=tmp_path, env={"MEGATRON_RL_ENTRY": str(entry)}
    )
    job = slurm.wait(job_id, timeout=60)
    log = slurm.log(job)
    # srun alone would report 143: rank 0, terminated by --kill-on-bad-exit after rank 1 failed.
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "7:0"), log
    assert "rank 1 ended first, with exit code 7" in log
    assert not (tmp_path / ".megatron-rl-exit").exists(), "exit records are cleaned up"


def test_exit_75_requeues_the_job(slurm, tmp_path):
    entry = tmp_path / "save_and_requeue.py"
    entry.write_text(
        "import os, sys\nsys.exit(75 if os.environ.get('SLURM_RESTART_COUNT', '0') == '0' else 0)\n"
    )
    job_id = slurm.sbatch(
        [*TWO_RANKS, SBATCH, "grpo_tiny_cpu"], cwd=tmp_path, env={"MEGATRON_RL_ENTRY": str(entry)}
    )

    # A requeued job waits ~2 minutes before it may start again: check the requeue, then cancel.
    def requeued_or_done(j: dict) -> bool:
        return (j["Restarts"] == "1" and j["JobState"] == "PENDING") or j["JobState"] in (
            "COMPLETED",
            "FAILED",
        )

    job = slurm.wait(job_id, timeout=60, until=requeued_or_done)
    slurm.run(["scancel", job_id])
    log = slurm.log(job)
    assert job["Restarts"] == "1" and job["JobState"] == "PENDING", log
    assert f"requeueing job {job_id}" in log


def test_tasks_and_gpus_per_node_must_match(slurm, tmp_path):
    args = ["--nodes=1", "--gpus-per-node=2", "--ntasks-per-node=1", "--time=5", SBATCH, "grpo_tiny_cpu"]
    job_id = slurm.sbatch(args, cwd=tmp_path, env={"MEGATRON_RL_ENTRY": CHECK})
    job = slurm.wait(job_id, timeout=60)
    log = slurm.log(job)
    assert job["ExitCode"] == "2:0", log
    assert "one rank per GPU needs --gpus-per-node=N and --ntasks-per-node=N" in log


def test_a_gpu_recipe_on_nodes_without_cuda_stops_at_the_doctor(slurm, tmp_path):
    """This node's torch has no CUDA: `megatron-rl doctor`, one task per node before any rank, refuses the
    h100 cluster in one line and the job ends with exit 2; the ranks' entry never runs."""
    args = [*TWO_RANKS, SBATCH, "grpo_tiny_cpu", "cluster=h100_80gb", "cluster.gpus_per_node=2"]
    job_id = slurm.sbatch(args, cwd=tmp_path, env={"MEGATRON_RL_ENTRY": CHECK})
    job = slurm.wait(job_id, timeout=90)
    log = slurm.log(job)
    assert job["ExitCode"] == "2:0", log
    assert "refused: CUDA: cluster h100_80gb is a GPU cluster (gpu=h100) but CUDA is unavailable here" in log
    assert "doctor refused this job (exit 2): no rank started" in log and "CHECK_DIST" not in log


def test_a_node_below_the_preflight_figures_stops_the_job_named(slurm, tmp_path):
    """The preflight runs on both tasks after the doctor; asked for the whole of a matmul rate no CPU has
    (1000 TFLOPS), it fails this node, names it with the exclude to resubmit with, and ends the job with
    exit 3 before the ranks' entry; its JSON has one entry per node with each figure."""
    over = ["cluster.peak_tflops_bf16=1000", "cluster.preflight_gemm_fraction=1"]
    job_id = slurm.sbatch(
        [*TWO_RANKS, SBATCH, "grpo_tiny_cpu", *over], cwd=tmp_path, env={"MEGATRON_RL_ENTRY": CHECK}
    )
    job = slurm.wait(job_id, timeout=120)
    log = slurm.log(job)
    assert job["ExitCode"] == "3:0", log
    node = job["NodeList"]
    out = json.loads(
        next(line for line in log.splitlines() if line.startswith("PREFLIGHT ")).removeprefix("PREFLIGHT ")
    )
    assert [n["host"] for n in out["nodes"]] == [node] and out["exclude"] == [node], out
    (entry,) = out["nodes"]
    assert entry["ranks"] == [0, 1] and not entry["passed"] and 0 < entry["gemm_tflops"] < 1000
    assert entry["memory_gbps"] > 0 and entry["allreduce_intra_gbps"] > 0, entry
    assert f"preflight failed node(s) {node}: no rank started" in log and f"--exclude={node}" in log
    assert "CHECK_DIST" not in log
