"""The solution process's seccomp filter: well-formed for both machines, and enforced by the kernel here."""

import ctypes
import errno
import os
import platform

import pytest

from megatron_rl.reward import seccomp


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_program_is_well_formed(machine):
    prog = seccomp.program(machine)
    assert prog is not None and len(prog) < 256
    for i, (code, jt, jf, _) in enumerate(prog):
        if code & 0x07 == 0x05:  # a conditional jump: both targets inside the program
            assert i + 1 + jt < len(prog) and i + 1 + jf < len(prog)
        if code == 0x06:  # every return allows, or fails with EPERM / ENOSYS: nothing kills
            assert prog[i][3] in (0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS)
    assert seccomp.program("sparc") is None


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64") or not hasattr(os, "fork"), reason="no filter table here"
)
def test_the_kernel_refuses_namespaces_and_mounts_but_not_fork_or_threads():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, as the zygote sets it
        seccomp.install()
        results = [
            libc.unshare(0x10000000) == -1 and ctypes.get_errno() == errno.EPERM,  # CLONE_NEWUSER
            libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None) == -1 and ctypes.get_errno() == errno.EPERM,
        ]
        child = os.fork()
        if child == 0:
            os._exit(7)
        results.append(os.waitpid(child, 0)[1] >> 8 == 7)
        import threading

        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        results.append(True)
        os.write(w, bytes(results))
        os._exit(0)
    os.close(w)
    got = os.read(r, 16)
    os.waitpid(pid, 0)
    assert list(got) == [1, 1, 1, 1]
