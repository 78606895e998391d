"""What each process of a sandbox job sets up for itself: the libc calls, capabilities, namespaces,
rlimits and descriptors of `harness.py`'s processes (the test runner T, PID 1 of its job, and the
solution U). Standard library only: `sandbox.py` ships it into the sandbox with the rest of the runtime.
"""

from __future__ import annotations

import ctypes
import os
import resource
import socket
import sys
from typing import Any

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID = 0x20000, 0x8000000, 0x10000000, 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, _PR_CAPBSET_DROP = 1, 4, 24
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 36, 38, 47
_INNER_ID = 1000  # the uid/gid a job sees itself as
_LIBC: Any = None


def libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def drop_capabilities() -> None:
    """Drop every capability (bounding, ambient, effective, permitted, inheritable) of this process."""
    lib = libc()
    for cap in range(64):
        if lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL past the last capability the kernel knows; EPERM when none are held
    lib.prctl(_PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    check(lib.capset(header, data), "capset")


_JOB_NAMESPACES = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWNET
# clone(2)'s number where its first argument is the flags (the others are 0 here, so their order is moot)
_SYS_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220, "ppc64le": 120, "ppc64": 120}


def fork_into_job_namespaces() -> int:
    """fork(), the child in new user, mount, PID, IPC and network namespaces: PID 1 of its own job.

    One clone(2) where `unshare` + `fork` would take two processes (unshare's new PID namespace holds
    only the caller's children), so each job costs one process fewer to copy and tear down. The child
    then runs `set_up_job_namespaces` with the zygote's ids (until its map is written it is nobody).
    Like fork() in a single-threaded process (the zygote has no other thread, which a raw clone needs),
    minus what CPython does after its own fork: of the runtime's modules only `random` has an at-fork
    hook, and it is reseeded here as os.fork would. The network namespace is new per job, not the sandbox's: otherwise
    one job's sockets (TIME_WAIT entries in /proc/net/tcp, abstract unix sockets) would be a channel
    to the next job's program.
    """
    number = _SYS_CLONE.get(os.uname().machine)
    if number is None:
        raise OSError(
            0,
            f"no clone(2) number known for {os.uname().machine}: the job sandbox runs on "
            f"{', '.join(sorted(_SYS_CLONE))}",
        )
    lib = libc()
    lib.syscall.restype = ctypes.c_long
    zero = ctypes.c_long(0)  # variadic: every argument a full long, no stray upper bits
    pid = lib.syscall(ctypes.c_long(number), ctypes.c_long(_JOB_NAMESPACES | 17), zero, zero, zero, zero)
    if pid < 0:  # 17: SIGCHLD to the parent when the child ends, as fork()'s
        check(-1, "clone into the job's namespaces")
    if pid == 0:
        if "random" in sys.modules:
            sys.modules["random"].seed()  # os.fork's after-fork hook of the random module
    return pid


def set_up_job_namespaces(uid: int, gid: int, tmp_mb: int) -> None:
    """In the child of `fork_into_job_namespaces`: map the job's ids (`uid`, `gid`: the zygote's), then
    fresh size-capped tmpfs mounts and the loopback of the job's own network."""
    lib = libc()
    lib.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # /proc/self/*_map is writable only while dumpable
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{_INNER_ID} {uid} 1"),
        ("gid_map", f"{_INNER_ID} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    lib.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    check(lib.mount(b"tmpfs", b"/tmp", b"tmpfs", flags, f"size={tmp_mb}m,mode=1777".encode()), "mount /tmp")
    if os.access("/dev/shm", os.W_OK):
        check(lib.mount(b"tmpfs", b"/dev/shm", b"tmpfs", flags, b"size=16m,mode=1777"), "mount /dev/shm")
    _loopback_up()


def _loopback_up() -> None:
    """Bring up the new network namespace's own loopback (programs may talk to themselves on it)."""
    import fcntl  # preloaded by the zygote
    import struct

    siocsifflags, iff_up_loopback_running = 0x8914, 0x1 | 0x8 | 0x40
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", iff_up_loopback_running))


def apply_limits(job: dict) -> None:
    mib = 1 << 20
    cpu = max(1, int(job["cpu_s"] + 0.999))
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL one second later
        resource.RLIMIT_AS: (job["memory_mb"] * mib,) * 2,
        # T and U count against the limit too (one user namespace per job): add them.
        resource.RLIMIT_NPROC: (job["max_processes"] + 2,) * 2,
        resource.RLIMIT_FSIZE: (job["max_file_mb"] * mib,) * 2,
        resource.RLIMIT_NOFILE: (job["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, value in limits.items():
        resource.setrlimit(which, value)


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor not in `keep` (close_range(2) under the hood: one syscall per gap)."""
    low = 0
    for fd in sorted(keep):
        if low < fd:  # an empty range is not a no-op: CPython passes high - 1 to close_range(2)
            os.closerange(low, fd)
        low = fd + 1
    high = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    high = high if 0 < high <= 1 << 20 else 1 << 20  # RLIM_INFINITY; fs.nr_open caps fds at 1M anyway
    if low < high:
        os.closerange(low, high)
