"""launch/torchrun.sh, the local launch: same bootstrap as the Slurm job, same rank map, sized by the recipe."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_local_torchrun_launch_maps_ranks_like_slurm(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))
    }
    env |= {
        "MEGATRON_RL_ENTRY": str(REPO / "launch" / "check_dist.py"),
        "PYTHON": str(REPO / ".venv/bin/python"),
    }
    env.pop("OMP_NUM_THREADS", None)  # the bootstrap's default applies
    proc = subprocess.run(
        [str(REPO / "launch" / "torchrun.sh"), "grpo_tiny_cpu"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("CHECK_DIST ")]
    rep = json.loads(line.removeprefix("CHECK_DIST "))
    assert rep["problems"] == [] and rep["world"] == rep["recipe_world"] == 2, (
        "sized from the recipe's layout"
    )
    ranks = sorted((r["rank"], r["local_rank"], r["local_world"], r["world"]) for r in rep["ranks"])
    assert ranks == [(0, 0, 2, 2), (1, 1, 2, 2)], "the same map as srun's one task per GPU"
    assert all(r["omp_threads"] == "1" and r["slurm_procid"] is None for r in rep["ranks"])
