"""The rank bootstrap: Slurm's and torchrun's variables give the same ranks, in dist_env and through the
real launch/rank.py and launch/bootstrap.sh (no Slurm needed: the launchers' variables are set by hand)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_rl.parallel.dist_env import from_env

REPO = Path(__file__).resolve().parents[3]
RANK_PY = REPO / "launch" / "rank.py"
NODES, PER_NODE, JOB = 2, 4, 4242
CLEAN = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
}


def slurm_env(rank: int) -> dict[str, str]:
    """What srun gives task `rank` of a 2-node x 4-task job (block distribution)."""
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(NODES * PER_NODE),
        "SLURM_LOCALID": str(rank % PER_NODE),
        "SLURM_NODEID": str(rank // PER_NODE),
        "SLURM_NNODES": str(NODES),
        "SLURM_NTASKS_PER_NODE": f"{PER_NODE}(x{NODES})",
        "SLURM_JOB_NODELIST": "gpu[003-004]",
        "SLURM_STEP_NODELIST": "gpu[003-004]",
        "SLURM_JOB_ID": str(JOB),
    }


def torchrun_env(rank: int) -> dict[str, str]:
    """What torchrun gives the same rank, with the master a Slurm job derives (first node, port per job)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(NODES * PER_NODE),
        "LOCAL_RANK": str(rank % PER_NODE),
        "LOCAL_WORLD_SIZE": str(PER_NODE),
        "MASTER_ADDR": "gpu003",
        "MASTER_PORT": str(20000 + JOB % 20000),
    }


def key(d) -> tuple:
    return (d.rank, d.world_size, d.local_rank, d.local_world_size, d.node_rank, d.master_addr, d.master_port)


@pytest.mark.parametrize("rank", range(NODES * PER_NODE))
def test_every_rank_maps_the_same_from_slurm_and_torchrun(rank):
    s, t = from_env(slurm_env(rank)), from_env(torchrun_env(rank))
    assert key(s) == key(t) == (rank, 8, rank % 4, 4, rank // 4, "gpu003", 24242)
    assert (s.launcher, t.launcher) == ("slurm", "torchrun")


def run_rank_py(env: dict[str, str], tmp_path: Path) -> dict:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')\n"
        "print(json.dumps({'env': {k: os.environ.get(k) for k in keys}, 'argv': sys.argv[1:], 'pid': os.getpid()}))\n"
    )
    proc = subprocess.run(
        [sys.executable, str(RANK_PY), str(probe), "grpo_tiny_cpu", "steps=2"],
        env={**CLEAN, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize("rank", [0, 5])
def test_rank_py_exports_the_same_variables_under_srun_and_torchrun(rank, tmp_path):
    s, t = run_rank_py(slurm_env(rank), tmp_path), run_rank_py(torchrun_env(rank), tmp_path)
    assert s["env"] == t["env"] == torchrun_env(rank)
    assert s["argv"] == ["grpo_tiny_cpu", "steps=2"]


def test_rank_py_records_a_ranks_own_failure_only(tmp_path):
    exit_dir = tmp_path / "exits"
    entry = tmp_path / "entry.py"
    started = tmp_path / "started"
    entry.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\n"
        f"open({str(started)!r}, 'w').close()\ntime.sleep(30)\n"
    )
    env = {**CLEAN, "MEGATRON_RL_EXIT_DIR": str(exit_dir)}
    failed = subprocess.run(
        [sys.executable, str(RANK_PY), str(entry)], env={**env, **slurm_env(1), "SLURMD_NODENAME": "gpu017"}
    )
    assert failed.returncode == 7
    t, code, rank, host = (exit_dir / "rank1").read_text().split()
    # the host as Slurm names it (SLURMD_NODENAME), which the job's failover leaves out when it is to blame
    assert (code, rank, host) == ("7", "1", "gpu017")
    assert float(t) <= time.time()

    # Rank 0 stopped by the scheduler (SIGTERM to every process of the step): a consequence, not recorded.
    proc = subprocess.Popen(
        [sys.executable, str(RANK_PY), str(entry)], env={**env, **slurm_env(0)}, start_new_session=True
    )
    deadline = time.monotonic() + 30
    while not started.exists():  # the parent set its handlers before it started the entry
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert sorted(p.name for p in exit_dir.iterdir()) == ["rank1"]


def test_bootstrap_sh_derives_the_port_dist_env_does_and_yields_to_the_user(tmp_path):
    script = (
        f"source {REPO / 'launch' / 'bootstrap.sh'}; "
        'echo "$MASTER_PORT $OMP_NUM_THREADS $NCCL_DEBUG $CUDA_DEVICE_MAX_CONNECTIONS $MEGATRON_RL_ENTRY $PYTHONPATH"'
    )
    env = {**CLEAN, **slurm_env(0), "MASTER_ADDR": "gpu003", "NCCL_DEBUG": "INFO"}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[0]) == from_env(slurm_env(0)).master_port == 24242
    assert out[1:] == ["1", "INFO", "1", "megatron_rl.train", str(REPO)]


def test_torchrun_agent_numbers_nodes_like_srun():
    sys.path.insert(0, str(REPO / "launch"))
    try:
        from torchrun_agent import agent_args
    finally:
        sys.path.remove(str(REPO / "launch"))
    assert agent_args(["--nproc-per-node=4", "x.py"], {"SLURM_NODEID": "1"}) == [
        "--node-rank=1",
        "--nproc-per-node=4",
        "x.py",
    ]
    assert agent_args(["--node-rank=0", "x.py"], {"SLURM_NODEID": "1"}) == ["--node-rank=0", "x.py"]
    assert agent_args(["x.py"], {}) == ["x.py"]
