"""A rank's watchdog: a heartbeat others can read, and an end to a wait that would never end.

Two jobs, on one daemon thread per rank:
- **Heartbeat.** Every `interval_s` it writes the rank's host, pid, phase and the time into
  `<folder>/beat.rank<R>` (slurm/train.sbatch gives every step an exit folder on the shared file
  system). The thread beats whatever the main thread is doing, so a rank that waits in a collective
  still beats, and one whose whole process stopped (a frozen node, a stopped process) does not:
  system/failover.py blames the node whose beats stopped first.
- **No progress.** The main thread calls `progress(phase)` as it enters each phase. When none comes for
  `timeout_s` (`cluster.dist_timeout_s`, which bounds every collective and must exceed the longest
  phase; checked once a beat, so within one beat of it), the rank is waiting for something that will
  not come: a peer that hangs outside any collective with a timeout, an engine that stopped answering, a
  collective whose backend does not time out. `on_stuck` is then called (it says so
  and flushes the log), every thread's stack is dumped to stderr, and the process ends with
  EXIT_PEER_LOST, which ends the job step instead of holding the allocation until its time limit.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from megatron_rl.system.failover import BEAT_PREFIX, EXIT_PEER_LOST, stale_after_s


def beat_interval_s(timeout_s: float) -> float:
    """A beat per minute of timeout, between 1 and 10 s: frequent enough to tell a hung rank within a
    fraction of the timeout, rare enough for a shared file system with thousands of ranks."""
    return min(10.0, max(1.0, timeout_s / 60.0))


def host_name() -> str:
    """The node's name as Slurm knows it (what --exclude and --nodelist take), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        rank: int,
        folder: Path | None = None,
        on_stuck: Callable[[str], None] | None = None,
        grace_s: float | None = None,
        interval_s: float | None = None,
    ):
        if timeout_s <= 0:
            raise ValueError(f"watchdog timeout must be > 0 s (cluster.dist_timeout_s); got {timeout_s}")
        self.timeout_s = timeout_s
        self.grace_s = 0.0 if grace_s is None else grace_s
        self.interval_s = beat_interval_s(timeout_s) if interval_s is None else interval_s
        self.rank = rank
        self.path = Path(folder) / f"{BEAT_PREFIX}{rank}" if folder else None
        self.on_stuck = on_stuck
        self.phase = "start"
        self._last = time.monotonic()
        # The last silence of this thread itself longer than the failover's staleness (system/failover.py): a
        # process stopped and resumed (a frozen node that came back, a SIGSTOP'd rank that Slurm's SIGCONT
        # woke to kill it) says so in its next beat, which would otherwise look fresh.
        self._prev_beat: float | None = None
        self.gap: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="megatron-rl-watchdog", daemon=True)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._beat()
        self._thread.start()

    def progress(self, phase: str) -> None:
        """The main thread moved on (entered `phase`)."""
        self.phase = phase
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 1)

    def _beat(self) -> None:
        now = time.time()
        if self._prev_beat is not None and now - self._prev_beat > stale_after_s(self.interval_s):
            self.gap = (self._prev_beat, now)
        self._prev_beat = now
        record = {
            "rank": self.rank,
            "host": host_name(),
            "pid": os.getpid(),
            "time": now,
            "interval_s": self.interval_s,
            "phase": self.phase,
            "gap": list(self.gap) if self.gap else None,
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.path is not None:
                try:
                    self._beat()
                except OSError as e:  # a full or lost file system must not end the rank by itself
                    print(f"watchdog: cannot write heartbeat {self.path}: {e}", file=sys.stderr)
            idle = time.monotonic() - self._last
            if idle > self.timeout_s + self.grace_s:
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        line = (
            f"rank {self.rank} made no progress for {idle:.0f} s in phase {self.phase} (cluster.dist_timeout_s="
            f"{self.timeout_s:g} s): a peer rank or its engine is hung; ending this rank so the job can go on "
            "without the hung node (stacks of every thread follow)"
        )
        try:
            if self.on_stuck is not None:
                self.on_stuck(line)
            else:
                print(f"error: {line}", file=sys.stderr)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        finally:
            os._exit(EXIT_PEER_LOST)
