"""A recipe on a GPU cluster, on this machine without CUDA: refused before anything is built, in one line
that names the cluster, torch's CUDA build and the likely cause, with exit 2 (megatron_rl/cli/doctor.py's rule),
by `launch_local` (no rank starts), by `megatron-rl export` and by the driver itself. CPU clusters are unaffected (every other launch
test). The sbatch path: tests/integration/slurm/test_slurm_launch.py."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.launch import REPO

GPU_CLUSTER = ["cluster=h100_80gb", "cluster.nodes=1", "cluster.gpus_per_node=2", "steps=1"]
REFUSAL = "error: cluster h100_80gb is a GPU cluster (gpu=h100) but CUDA is unavailable here: torch "


def _run(module: str, recipe: str, tmp_path) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    args = [*GPU_CLUSTER, f"logger.run_dir={tmp_path / 'outputs'}", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    return subprocess.run(
        [sys.executable, "-m", module, recipe, *args],
        capture_output=True, text=True, timeout=180, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _assert_refused(proc: subprocess.CompletedProcess, tmp_path) -> None:
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(REFUSAL), proc.stderr
    assert "CPU-only build (torch.version.cuda is None)" in lines[0]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "ckpt").exists(), "nothing was started"


def test_launch_local_refuses_a_gpu_cluster_before_any_rank_starts(tmp_path):
    proc = _run("megatron_rl.cli.launch_local", "grpo_tiny_hf_cpu", tmp_path)
    _assert_refused(proc, tmp_path)
    assert "torchrun" not in proc.stdout + proc.stderr and "[rank" not in proc.stdout + proc.stderr


def test_the_driver_refuses_a_gpu_cluster_before_building_anything(tmp_path):
    _assert_refused(_run("megatron_rl.train", "grpo_tiny_cpu", tmp_path), tmp_path)


def test_export_refuses_a_gpu_cluster_before_any_rank_starts(tmp_path):
    """`megatron-rl export` launches ranks on this machine as `run` does: the same refusal, exit 2, and
    neither the folder nor its log is made."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")
    }
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_rl.cli.export", "grpo_tiny_cpu", str(tmp_path / "ckpt"),
         str(tmp_path / "hf"), *GPU_CLUSTER],
        capture_output=True, text=True, timeout=180, cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    _assert_refused(proc, tmp_path)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.log").exists()
