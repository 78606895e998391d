"""`megatron-rl preflight` started by hand on this machine: it launches itself as the cluster's
`gpus_per_node` (2) ranks under torchrun, as slurm/train.sbatch runs it over srun (one process per
device); every rank measures, rank 0 reports one node with its all-reduce, and the verdict is the exit
status. A threshold this CPU cannot reach (the matmul at the cluster config's full peak) fails the node
by name, exit 3."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers.launch import REPO

pytestmark = pytest.mark.slow


def test_alone_it_starts_one_rank_per_device_and_names_a_slow_node(tmp_path):
    out = tmp_path / "preflight.json"
    cmd = [sys.executable, "-m", "megatron_rl.cli", "preflight", "grpo_tiny_cpu"]
    cmd += ["cluster.peak_tflops_bf16=1000", "cluster.preflight_gemm_fraction=1", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 3, console
    host = socket.gethostname()
    assert "megatron-rl preflight: 1 node(s), 2 rank(s), cluster cpu_2core" in console, console
    assert f"leave out: {host} (sbatch --exclude={host})" in console, console
    report = json.loads(out.read_text())
    (node,) = report["nodes"]
    assert (node["host"], node["ranks"], node["passed"], report["exclude"]) == (host, [0, 1], False, [host])
    assert node["failures"] == [
        f"gemm {node['gemm_tflops']:.3g} TFLOPS on {_slowest(report)} < 1 x 1e+03 TFLOPS expected"
    ]
    assert node["allreduce_intra_gbps"] > 0 and node["memory_gbps"] > 0, "both ranks measured the rest"
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["job_failures"] == []


def _slowest(report) -> str:
    return min(report["ranks"], key=lambda r: r["gemm_tflops"])["device"]
