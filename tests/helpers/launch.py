"""Launch a script under torchrun from a test: free port, OMP_NUM_THREADS=1, output captured."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_worker(script: str | Path, args: list[str], timeout: float = 600, env: dict | None = None):
    """Run `python script args` in its own process (a fresh interpreter for vLLM or megatron-core)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-6000:]
        raise AssertionError(f"{Path(script).name} failed (rc={proc.returncode}):\n{tail}")
    return proc


def run_workers(jobs: dict, timeout: float = 600, env: dict | None = None, at_once: int = 2) -> dict:
    """Run independent single-process workers (`{key: (script, args)}`) `at_once` at a time: on 2 cores a
    one-process worker leaves a core idle. Returns {key: its CompletedProcess, or the AssertionError
    run_worker raised for it}: each test that reads one raises its own (`worker_result`)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        script, args = item
        try:
            return run_worker(script, args, timeout=timeout, env=env)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            return e

    with ThreadPoolExecutor(at_once) as pool:
        return dict(zip(jobs, pool.map(one, jobs.values())))


def worker_result(outcome):
    """A run_workers entry: the CompletedProcess, or its failure raised here."""
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def torchrun(script: str | Path, nproc: int, args: list[str], timeout: float = 600, env: dict | None = None):
    """Run `torchrun --nproc-per-node nproc script args`; raise with the output tail on failure."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(script),
        *args,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-6000:]
        raise AssertionError(f"torchrun {Path(script).name} failed (rc={proc.returncode}):\n{tail}")
    return proc
