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
