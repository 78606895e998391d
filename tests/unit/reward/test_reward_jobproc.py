"""jobproc.py: what a job process sets up for itself, where it can be checked without a sandbox."""

from __future__ import annotations

import os

import pytest

from megatron_rl.reward import jobproc


def test_a_machine_without_a_known_clone_number_is_refused_by_name(monkeypatch):
    """The raw clone(2) needs the system call's number; on a machine we have none for, the sandbox
    refuses to start (its self-test reports the error) instead of calling a wrong system call."""
    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, real.release, real.version, "s390x"))
    monkeypatch.setattr(jobproc.os, "uname", lambda: fake)
    with pytest.raises(OSError, match="no clone.2. number known for s390x.*x86_64"):
        jobproc.fork_into_job_namespaces()


def test_close_all_but_keeps_exactly_the_descriptors_asked_for():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # in a child: closing descriptors here must not disturb pytest
        code = 0
        try:
            jobproc.close_all_but({0, 1, 2, w})
            os.fstat(w)
            try:
                os.fstat(r)
                code = 1
            except OSError:
                pass
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    assert os.waitstatus_to_exitcode(status) == 0
