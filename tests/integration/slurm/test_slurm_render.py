"""`megatron-rl submit --dry-run` for every shipped recipe, checked by the real controller.

The printed command is run as printed plus `--hold`: Slurm parses it and checks it against a partition,
and `scontrol show job` says what it understood (nodes, tasks, GPUs per node, time, script and
arguments), which must match the recipe's layout. The big recipes go to the `render` partition (32
DOWN nodes of 8 GPUs), where nothing ever runs; every held job is cancelled.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from megatron_rl.config.load import load_recipe, shipped_recipes
from megatron_rl.parallel.layout import ParallelLayout

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[3]


def seconds(slurm_time: str) -> int:
    """'2-00:00:00', '48:00:00', '30:00' or '90' (minutes) -> seconds."""
    days, _, rest = slurm_time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:  # minutes, or hours after a day count
        hms = [parts[0], 0, 0] if days else [0, parts[0], 0]
    else:
        hms = ([0] * (3 - len(parts)) + parts) if not days else (parts + [0] * (3 - len(parts)))
    return int(days or 0) * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2]


def test_seconds_reads_slurm_time_forms():
    assert seconds("2-00:00:00") == seconds("48:00:00") == 172800
    assert seconds("00:30:00") == seconds("30") == 1800
    assert seconds("1-12") == 129600


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_dry_run_command_is_what_slurm_schedules(slurm, tmp_path, name):
    recipe = load_recipe(name)
    c = recipe.cluster
    partition = "debug" if c.gpus_per_node <= 2 else "render"  # the local node has 2 (fake) GPUs
    cli = [
        sys.executable,
        "-m",
        "megatron_rl.cli",
        "submit",
        name,
        f"cluster.partition={partition}",
        "--dry-run",
        "--remote-paths",  # the GPU recipes' checkpoints live on the cluster's storage, not on this machine
    ]
    printed = slurm.run(cli, cwd=tmp_path).stdout.strip().splitlines()
    assert len(printed) == 1, printed
    argv = shlex.split(printed[0])
    assert argv[0] == "sbatch"
    (tmp_path / "logs").mkdir()
    job_id = slurm.sbatch(["--hold", *argv[1:]], cwd=tmp_path)
    try:
        job = slurm.job(job_id)
    finally:
        slurm.run(["scancel", job_id])

    world = ParallelLayout.from_config(recipe.layout).world_size
    assert job["JobState"] == "PENDING" and job["Reason"] == "JobHeldUser"
    assert job["JobName"] == recipe.name and job["Partition"] == partition
    assert job["NumNodes"].split("-")[0] == str(c.nodes)
    assert int(job["NumTasks"]) == world == c.nodes * c.gpus_per_node, "one task per GPU, one rank per task"
    assert job["NtasksPerN:B:S:C"].split(":")[0] == str(c.gpus_per_node)
    assert job["TresPerNode"] == f"gres:gpu:{c.gpus_per_node}"
    assert seconds(job["TimeLimit"]) == seconds(c.time_limit)
    assert job["Command"] == f"{REPO / 'slurm' / 'train.sbatch'} {name} cluster.partition={partition}"
    assert job["StdOut"] == str(tmp_path / "logs" / f"{name}-{job_id}.log")


def test_a_layout_that_does_not_fit_is_refused_before_sbatch(slurm, tmp_path):
    before = slurm.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
    cli = [
        sys.executable,
        "-m",
        "megatron_rl.cli",
        "submit",
        "grpo_qwen2.5-7b_1n8g",
        "cluster.nodes=2",
        "cluster.partition=render",
        "--sbatch=--hold",
    ]
    proc = slurm.run(cli, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "trainer world tp x pp x dp x cp = 8 must equal" in proc.stderr and "= 16" in proc.stderr
    assert "set cluster.nodes=1" in proc.stderr
    assert slurm.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split() == before, "nothing was queued"


def test_a_recipe_with_its_own_fleet_is_a_heterogeneous_job_slurm_schedules(slurm, tmp_path):
    name = "grpo_qwen2.5-32b_32n8g"
    fleet = ["reward.fleet_nodes=4", "reward.fleet_cpus_per_node=64", "reward.fleet_partition=render-cpu"]
    cli = [sys.executable, "-m", "megatron_rl.cli", "submit", name, "cluster.partition=render", *fleet]
    printed = slurm.run([*cli, "--dry-run", "--remote-paths"], cwd=tmp_path).stdout.strip()
    (tmp_path / "logs").mkdir()
    job_id = slurm.sbatch(["--hold", *shlex.split(printed)[1:]], cwd=tmp_path)
    try:
        gpus, cpus = slurm.components(job_id)
    finally:
        slurm.run(["scancel", job_id])
    assert gpus["HetJobId"] == cpus["HetJobId"] == job_id and (
        gpus["HetJobOffset"],
        cpus["HetJobOffset"],
    ) == (
        "0",
        "1",
    )
    assert (gpus["Partition"], gpus["NumNodes"].split("-")[0], gpus["TresPerNode"]) == (
        "render",
        "32",
        "gres:gpu:8",
    )
    assert (cpus["Partition"], cpus["NumNodes"].split("-")[0], cpus["NumTasks"]) == ("render-cpu", "4", "4")
    assert cpus["CPUs/Task"] == "64" and cpus["OverSubscribe"] == "NO", "whole CPU nodes, one server each"
    assert "TresPerNode" not in cpus or "gpu" not in cpus["TresPerNode"], "the fleet asks for no GPU"
    assert seconds(cpus["TimeLimit"]) == seconds(gpus["TimeLimit"])
    assert (
        gpus["Command"]
        == f"{REPO / 'slurm' / 'train.sbatch'} {name} cluster.partition=render {' '.join(fleet)}"
    )
