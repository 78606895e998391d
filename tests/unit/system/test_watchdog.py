"""The rank's watchdog (system/watchdog.py), in real processes: it beats into its folder, says when its
process was stopped and resumed, and ends a rank that makes no progress with the lost-peer code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from megatron_rl.system.failover import EXIT_PEER_LOST, read_beats
from tests.helpers.launch import REPO

_RANK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from megatron_rl.system.watchdog import Watchdog
    folder, timeout, progress = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
    w = Watchdog(timeout, 3, folder, grace_s=0.5, interval_s=0.2)
    print("up", flush=True)
    for i in range(200):
        if progress:
            w.progress(f"phase{i}")
        time.sleep(0.05)
    w.stop()
    """
)


def _start(tmp_path, timeout: float, progress: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURMD_NODENAME": "node7"}
    p = subprocess.Popen(
        [sys.executable, "-c", _RANK, str(tmp_path), str(timeout), "1" if progress else "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "up"
    return p


def test_a_rank_without_progress_ends_with_the_lost_peer_code_and_its_stacks(tmp_path):
    p = _start(tmp_path, timeout=1.0, progress=False)
    err = p.communicate(timeout=30)[1]
    assert p.returncode == EXIT_PEER_LOST, err
    assert "rank 3 made no progress for" in err and "in phase start" in err
    assert "Thread" in err  # faulthandler's dump of every thread


def test_a_rank_making_progress_beats_and_is_left_alone(tmp_path):
    p = _start(tmp_path, timeout=1.0, progress=True)
    time.sleep(1.0)
    (beat,) = read_beats(tmp_path)
    assert (beat.rank, beat.host, beat.pid, beat.gap) == (3, "node7", p.pid, None)
    assert beat.phase.startswith("phase") and abs(beat.time - time.time()) < 5
    p.communicate(timeout=60)
    assert p.returncode == 0


def test_a_stopped_and_resumed_rank_reports_its_silence(tmp_path):
    p = _start(tmp_path, timeout=600.0, progress=True)
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGSTOP)
    stopped = time.time()
    time.sleep(11.5)  # longer than 3 beats + 10 s of slack at 0.2 s a beat
    os.kill(p.pid, signal.SIGCONT)
    time.sleep(1.0)
    gap = json.loads((tmp_path / "beat.rank3").read_text())["gap"]
    p.kill()
    p.wait()
    assert gap and gap[0] <= stopped + 0.5 and gap[1] >= stopped + 11, gap
