"""A memory cgroup for each sandbox: one bound on everything a job holds, not per process.

Per-process rlimits (`RLIMIT_AS`) do not see what a job can hold outside its address space: memfd
and /dev/shm files it writes to and unmaps, tmpfs pages, or memory spread over many children. A
memory cgroup counts all of it, with the kernel's OOM killer behind the limit. The host creates one
cgroup per sandbox, next to its own, and starts the sandbox inside it, so the zygote and every job it
forks are charged to it; a sandbox runs one job at a time, so the limit (`memory_mb` plus
`RUNNER_OVERHEAD_MB` for the zygote and the test runner) bounds the job. Moving each job into a
cgroup of its own instead would cost an RCU grace period per job, during which every fork and exit on
the host waits. Each job process asks to be the OOM killer's first choice (oom_score_adj 1000); a
program that lowers its own back can make the kernel pick the zygote instead, which costs a sandbox
restart and still ends the job as `memory`. The host reads the cgroup's OOM-kill counter after each
job, to report `memory` rather than `crashed` when the kernel, not the program, ended it.

Where the host allows it: cgroup v1's memory hierarchy, or a cgroup v2 directory whose parent has
already delegated the memory controller (`cgroup.subtree_control`), writable by this process (root,
or a delegated subtree). Elsewhere `JobCgroup.create` returns None, the sandbox logs it once, and the
job's memory is bounded only by processes x the address-space limit; memfd and shm pages are then
bounded by nothing but the job's wall-clock deadline (the residual risk).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

RUNNER_OVERHEAD_MB = 64  # the zygote, the spare job process and the test runner, on top of memory_mb
_counter = itertools.count()
_warned = False


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """The directory of this process's memory cgroup and the hierarchy's version, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1 = path
        elif controllers == "":
            v2 = path
    for mount in mounts:
        fields = mount.split()
        sep = fields.index("-")
        fstype, options, point = fields[sep + 1], fields[-1], fields[4]
        if v1 is not None and fstype == "cgroup" and "memory" in options.split(","):
            return Path(point + v1), 1
        if v1 is None and v2 is not None and fstype == "cgroup2":
            here = Path(point + v2)
            try:
                if "memory" in (here / "cgroup.subtree_control").read_text().split():
                    return here, 2
            except OSError:
                return None
    return None


class JobCgroup:
    """One memory cgroup with a limit, for the jobs of one sandbox (they run one at a time)."""

    def __init__(self, path: Path, version: int) -> None:
        self.path, self.version = path, version
        self._oom_seen = 0

    @classmethod
    def create(cls, limit_mb: int) -> JobCgroup | None:
        """A fresh cgroup limited to `limit_mb` MiB (swap included), or None where none can be made."""
        global _warned
        found = _own_memory_cgroup()
        if found is not None:
            parent, version = found
            path = parent / f"megatron-rl-sandbox-{os.getpid()}-{next(_counter)}"
            try:
                path.mkdir()
                group = cls(path, version)
                group._set_limit(limit_mb << 20)
                return group
            except OSError as e:
                log.debug("no memory cgroup at %s: %s", path, e)
                try:
                    path.rmdir()
                except OSError:
                    pass
        if not _warned:
            _warned = True
            log.warning(
                "no writable memory cgroup here: a reward job's memory is bounded per process only "
                "(memfd and shared-memory files are bounded by the job's deadline alone)"
            )
        return None

    def _set_limit(self, limit: int) -> None:
        if self.version == 1:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            swap = self.path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory + swap: a job may not escape the limit into swap
                swap.write_text(str(limit))
        else:
            (self.path / "memory.max").write_text(str(limit))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")

    @property
    def procs(self) -> Path:
        """`cgroup.procs`: writing "0" to it moves the writing process in (its children follow at fork)."""
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        """How many processes the kernel has OOM-killed in this cgroup so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def new_oom_kills(self) -> int:
        """OOM kills since the last call: the host asks once after each job."""
        now = self.oom_kills()
        new, self._oom_seen = now - self._oom_seen, now
        return new

    def remove(self) -> None:
        """Remove the cgroup; its processes must be gone (the sandbox is killed first)."""
        for _ in range(100):  # the kernel reaps a killed namespace's processes asynchronously
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                error = e
                time.sleep(0.01)
        log.warning("could not remove the reward sandbox's cgroup %s: %s", self.path, error)
