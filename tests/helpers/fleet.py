"""Real `megatron-rl reward-server` processes on loopback, for the tests that score through a fleet."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from megatron_rl.reward.server import TOKEN_ENV, launch_here

REPO = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-of-this-test-job-0123456789"
# conf/reward/sandbox.yaml's settings, which a server must score with for the tiny recipe's run
TINY_REWARD = ("--mode", "fraction", "--timeout-s", "10", "--memory-mb", "512")


def start_server(tmp_path: Path, name: str, *args: str, token: str = TOKEN, latency_s: float = 0.05):
    """A reward-server on a free loopback port, its output in tmp_path/<name>.log; (process, host:port)."""
    env = {
        **os.environ,
        TOKEN_ENV: token,
        "MEGATRON_RL_VERIFIER_LATENCY_S": str(latency_s),
        "PYTHONPATH": str(REPO),
    }
    return launch_here(list(args), env, tmp_path / f"{name}.log")


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
