"""A real Slurm for the test session: munged, slurmctld and slurmds on localhost, state in a temp dir.

`tools/slurm_local.sh` does the work (installing Debian's slurm-wlm and munge when missing); this
fixture picks free ports and a random first job id, so the cluster can run next to another test
session's, and stops the daemons it started by their PID files when the session ends. The node
advertises 2 fake GPUs (GRES on /dev/null clones), so `--gpus-per-node=2` is accepted on this CPU
machine; a `render` partition of 32 DOWN 8-GPU nodes takes held jobs, so the big recipes' sbatch
commands can be checked by the real controller without running them. A second slurmd on this machine is
node cpu01 of the `cpu` partition, where a job's reward fleet runs (`render-cpu`: its DOWN counterpart).
Four more, sim01-04 of the `sim` partition, one fake GPU each, are the nodes a job loses and replaces.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.launch import REPO, free_port

SLURM_LOCAL = REPO / "tools" / "slurm_local.sh"
DONE_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def parse_job(text: str) -> dict[str, str]:
    """`scontrol show job -o` -> {field: value}. Command holds spaces and key=value overrides, so it is cut
    out first (it is always followed by WorkDir)."""
    text = " " + text.strip()
    command = re.search(r" Command=(.*?) WorkDir=", text)
    if command:
        text = text.replace(command.group(0), " WorkDir=")
    fields = dict(tok.split("=", 1) for tok in text.split() if "=" in tok)
    if command:
        fields["Command"] = command.group(1)
    return fields


@dataclass
class SlurmCluster:
    """Handle on the session's cluster: its environment and a few job helpers."""

    base: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(self, cmd: list[str], cwd: Path | None = None, env: dict | None = None, check: bool = True):
        proc = subprocess.run(cmd, cwd=cwd, env={**self.env, **(env or {})}, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, args: list[str], cwd: Path, env: dict | None = None) -> str:
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd, env=env).stdout.strip()
        return out.split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """The job, or a heterogeneous job's first component (where its batch script runs)."""
        return self.components(job_id)[0]

    def components(self, job_id: str) -> list[dict[str, str]]:
        """Each component of a heterogeneous job (one line each, in offset order); a plain job's one."""
        out = self.run(["scontrol", "show", "job", "-o", job_id]).stdout
        return [parse_job(line) for line in out.splitlines() if line.strip()]

    def wait(
        self, job_id: str, timeout: float, until=lambda j: j["JobState"] in DONE_STATES
    ) -> dict[str, str]:
        """Poll the job until `until(job)`; sbatch --wait polls with growing intervals (up to 30 s)."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                self.run(["scancel", job_id], check=False)
                raise AssertionError(f"job {job_id} not done after {timeout} s: {job.get('JobState')}")
            time.sleep(0.3)

    def log(self, job: dict[str, str]) -> str:
        path = Path(job["StdOut"])
        return path.read_text() if path.exists() else f"<no log at {path}>"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> SlurmCluster:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm runs its daemons as root; run the Slurm tier as root")
    if not (shutil.which("slurmctld") and shutil.which("munged")) and not shutil.which("apt-get"):
        pytest.skip("slurm-wlm and munge are not installed and apt-get is unavailable to install them")
    base = tmp_path_factory.mktemp("slurm")
    settings = {
        "SLURM_BASE": str(base),
        "SLURMCTLD_PORT": str(free_port()),
        "SLURMD_PORT": str(free_port()),
        "FAKE_GPUS": "2",
        "RENDER_NODES": "32",
        "RENDER_GPUS": "8",
        "FLEET_NODES": "1",  # cpu01 in the `cpu` partition: a reward fleet's node (test_slurm_train.py)
        "FLEET_SLURMD_PORT": str(free_port()),
        "SIM_NODES": "4",  # sim01-04, one fake GPU each: a run of 2 nodes and 2 spares (test_slurm_spares.py)
        # Jobs derive their rendezvous port from the id: keep clear of another session's cluster.
        "FIRST_JOB_ID": str(random.randrange(1000, 19000, 100)),
    }
    env = {**os.environ, **settings}
    t0 = time.monotonic()
    up = subprocess.run(["bash", str(SLURM_LOCAL), "up"], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        subprocess.run(["bash", str(SLURM_LOCAL), "down"], env=env, capture_output=True, text=True)
        raise AssertionError(f"local Slurm did not start:\n{up.stdout}\n{up.stderr}")
    print(f"\nlocal Slurm up in {time.monotonic() - t0:.1f} s at {base}")
    cluster_env = {
        **os.environ,
        "SLURM_CONF": str(base / "etc" / "slurm.conf"),
        "MEGATRON_RL_HOME": str(REPO),
        "PYTHON": str(REPO / ".venv" / "bin" / "python"),
        "OMP_NUM_THREADS": "1",
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MEGATRON_RL_ENTRY"):
        cluster_env.pop(key, None)  # an outer launcher's values would win over the job's own
    daemons = [base / "munge/munged.pid", base / "run/slurmctld.pid", *sorted(base.glob("run/slurmd-*.pid"))]
    pids = [p.read_text().strip() for p in daemons]
    assert len(pids) == 8, f"munged, slurmctld and six slurmds (the GPU node, cpu01, sim01-04): {daemons}"
    try:
        yield SlurmCluster(base=base, env=cluster_env)
    finally:
        down = subprocess.run(["bash", str(SLURM_LOCAL), "down"], env=env, capture_output=True, text=True)
        alive = [p for p in pids if Path(f"/proc/{p}").exists()]
        assert down.returncode == 0 and not alive, (
            f"daemons {alive} still running:\n{down.stdout}\n{down.stderr}"
        )
