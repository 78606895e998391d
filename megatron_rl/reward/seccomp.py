"""A seccomp filter for the solution process: no namespaces, no mounts, no tracing, no kernel extensions.

Standard library only (ctypes); loaded inside the sandbox with the rest of the runtime (`harness.py`).

Why: each job runs in user, mount, PID, IPC and network namespaces of its own, where the solution
process holds no capabilities. But an unprivileged process may create a *new* user namespace and hold
every capability inside it: from there it could mount a tmpfs of any size past the job's `/tmp` cap,
or rearrange its view of the filesystem. bubblewrap's `--disable-userns` would forbid that only for
the sandbox as a whole, which would also forbid the per-job namespaces the harness creates, so the
filter is installed in the solution process alone, after those namespaces exist, and is inherited by
everything it forks. What it refuses (EPERM): `unshare`, `setns`, `clone` with any namespace flag,
every mount-API call, `chroot`, `ptrace` and `process_vm_*`, `bpf`, `perf_event_open`,
`userfaultfd`, `io_uring` (its operations bypass seccomp), key-ring calls and module/kexec loading.
`clone3` answers ENOSYS, so libc falls back to `clone`, whose flags the filter can read. On x86_64 the
x32 ABI is refused as a whole. Other architectures than x86_64 and aarch64 get no filter
(`install` returns False) and keep only the capability and namespace isolation.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import Any

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_CLONE_NAMESPACES = (
    0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)
_X32_BIT = 0x40000000

_DENIED_NAMES = (
    "unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick "
    "mount_setattr ptrace process_vm_readv process_vm_writev bpf perf_event_open userfaultfd "
    "io_uring_setup io_uring_enter io_uring_register keyctl add_key request_key kexec_load "
    "init_module finit_module delete_module name_to_handle_at open_by_handle_at"
).split()
# (audit arch, clone, clone3, {name: number}) per machine
_TABLES = {
    "x86_64": (
        0xC000003E,
        56,
        435,
        dict(
            unshare=272,
            setns=308,
            mount=165,
            umount2=166,
            pivot_root=155,
            chroot=161,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            ptrace=101,
            process_vm_readv=310,
            process_vm_writev=311,
            bpf=321,
            perf_event_open=298,
            userfaultfd=323,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            keyctl=250,
            add_key=248,
            request_key=249,
            kexec_load=246,
            init_module=175,
            finit_module=313,
            delete_module=176,
            name_to_handle_at=303,
            open_by_handle_at=304,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        220,
        435,
        dict(
            unshare=97,
            setns=268,
            mount=40,
            umount2=39,
            pivot_root=41,
            chroot=51,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            ptrace=117,
            process_vm_readv=270,
            process_vm_writev=271,
            bpf=280,
            perf_event_open=241,
            userfaultfd=282,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            keyctl=219,
            add_key=217,
            request_key=218,
            kexec_load=104,
            init_module=105,
            finit_module=273,
            delete_module=106,
            name_to_handle_at=264,
            open_by_handle_at=265,
        ),
    ),
}


def program(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The BPF program as (code, jt, jf, k) tuples for this machine, or None where there is no table."""
    table = _TABLES.get(machine or os.uname().machine)
    if table is None:
        return None
    arch, clone, clone3, numbers = table
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to relative offsets below
    ins: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, 4),  # seccomp_data.arch
        (_JEQ_K, None, "deny", arch),
        (_LD_W_ABS, None, None, 0),  # seccomp_data.nr
    ]
    if arch == _TABLES["x86_64"][0]:
        ins.append((_JGE_K, "deny", None, _X32_BIT))
    ins += [(_JEQ_K, "deny", None, nr) for nr in sorted({numbers[name] for name in _DENIED_NAMES})]
    ins += [
        (_JEQ_K, "clone", None, clone),
        (_JEQ_K, "enosys", None, clone3),
        (_RET_K, None, None, _RET_ALLOW),
    ]
    labels = {"clone": len(ins)}
    ins += [
        (_LD_W_ABS, None, None, 16),  # seccomp_data.args[0], low 32 bits (little-endian): the clone flags
        (_JSET_K, "deny", None, _CLONE_NAMESPACES),
        (_RET_K, None, None, _RET_ALLOW),
    ]
    labels["deny"] = len(ins)
    ins.append((_RET_K, None, None, _RET_ERRNO | errno.EPERM))
    labels["enosys"] = len(ins)
    ins.append((_RET_K, None, None, _RET_ERRNO | errno.ENOSYS))

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(ins)]


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_prepared: tuple[Any, Any, Any] | None = None  # (prctl, filter buffer, sock_fprog), built once per zygote


def prepare() -> bool:
    """Build the filter once (the zygote does, before it forks), so installing it costs one prctl."""
    global _prepared
    if _prepared is None:
        prog = program()
        if prog is None:
            return False
        raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
        buf = ctypes.create_string_buffer(raw, len(raw))
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in each forked solution
        _prepared = (prctl, buf, _Fprog(len(prog), ctypes.addressof(buf)))
    return True


def install() -> bool:
    """Install the filter on this process (and all it will fork). False where the machine has no table.

    Needs no_new_privs, which the zygote sets for the whole sandbox. Raises OSError if the kernel refuses.
    """
    if not prepare():
        return False
    assert _prepared is not None
    prctl, _, fprog = _prepared
    if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {errno.errorcode.get(err, err)}")
    return True
