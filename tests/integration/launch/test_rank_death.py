"""A rank killed by a signal (SIGSEGV, abort(), the OOM killer) under torchrun, through the console.

Such a death skips every handler in the rank: what it wrote last on stderr (an NCCL watchdog timeout, a
CUDA error, a faulthandler dump) must still reach log.txt, and the launcher's summary must show that
rank's last lines, not another rank's.
"""

import os
import subprocess
import sys
import textwrap

from tests.helpers.launch import REPO, free_port

RANK = """
import faulthandler, os, signal, sys, time
from pathlib import Path
from megatron_rl.telemetry import console

def main():
    rank = int(os.environ["RANK"])
    console.start(Path(os.environ["MEGATRON_RL_LOG"]), rank)
    print(f"chatter from rank {rank}", flush=True)
    if rank == 1:
        time.sleep(0.5)
        os.write(2, b"watchdog caught collective operation timeout\\n")
        faulthandler.enable()
        os.kill(os.getpid(), signal.SIGSEGV)
    while True:  # rank 0 keeps logging until torchrun stops it
        print("rank 0 noise", flush=True)
        time.sleep(0.05)

sys.exit(console.run_guarded(main))
"""


def test_a_rank_killed_by_sigsegv_keeps_its_last_lines(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    log = tmp_path / "run" / "log.txt"
    cmd = [sys.executable, "-m", "megatron_rl.cli.launch_torchrun", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MEGATRON_RL_LOG": str(log)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=180)
    assert done.returncode == 1, done.stderr
    lines = log.read_text().splitlines()
    ours = [line for line in lines if line.startswith("[rank1] ")]
    assert "[rank1] watchdog caught collective operation timeout" in ours, ours
    assert any("Fatal Python error: Segmentation fault" in line for line in ours), ours
    err = done.stderr
    assert "rank 1 (pid" in err and "ended with signal SIGSEGV" in err, err
    tail = err[err.index("run failed; the last") :].splitlines()
    assert "of rank 1 in" in tail[0], err
    assert tail[1:] and all(line.startswith("  [rank1] ") for line in tail[1:]), err
    assert any("Segmentation fault" in line or "File " in line for line in tail[1:]), err
    assert "rank 0 noise" not in err and "Traceback" not in err
