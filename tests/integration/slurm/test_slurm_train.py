"""The tiny recipe trained through `sbatch slurm/train.sbatch`, as a user submits it: 2 tasks on one node,
one rank each (srun, no torchrun), real trainer, engines and rewards. Checks the job's exit, its log and
the step records the run writes under `<logger.run_dir>/<recipe>-<job id>/`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[3]
STEPS = 2


def test_tiny_recipe_trains_through_sbatch(slurm, tmp_path):
    overrides = [
        f"steps={STEPS}",
        f"logger.run_dir={tmp_path / 'outputs'}",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "logger.progress=false",
    ]
    args = [
        "--job-name=grpo_tiny_cpu",
        "--nodes=1",
        "--gpus-per-node=2",
        "--ntasks-per-node=2",
        "--time=20",
        f"--output={tmp_path}/%x-%j.log",
        "slurm/train.sbatch",
        "grpo_tiny_cpu",
        *overrides,
    ]
    job_id = slurm.sbatch(args, cwd=REPO, env={"WANDB_MODE": "offline"})
    job = slurm.wait(job_id, timeout=1200)
    log = slurm.log(job)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log[-8000:]
    assert "launcher srun" in log and f"megatron-rl job {job_id} done, exit code 0" in log

    run_dir = tmp_path / "outputs" / f"grpo_tiny_cpu-{job_id}"  # the run is named after the job
    records = [
        json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines() if line.strip()
    ]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), log[-4000:]
    for r in records:
        assert r["phases"]["generation"]["seconds"] > 0 and r["phases"]["train_fwd_bwd"]["seconds"] > 0
        assert len(r["phases"]["generation"]["seconds_by_rank"]) == 2, "both srun tasks joined the run"
