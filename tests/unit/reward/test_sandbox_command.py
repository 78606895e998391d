"""What the sandbox's command line exposes: only the system, the interpreter, and nothing of ours."""

import os
import sys

import pytest

from megatron_rl.reward.sandbox import SandboxLimits, bwrap_command


def _mounts(cmd: list[str]) -> list[tuple[str, str]]:
    return [(cmd[i], cmd[i + 2]) for i, a in enumerate(cmd) if a in ("--ro-bind", "--bind", "--dev-bind")]


def test_only_system_and_interpreter_are_mounted_read_only():
    cmd = bwrap_command("/usr/bin/bwrap", 5)
    mounts = _mounts(cmd)
    assert all(kind == "--ro-bind" for kind, _ in mounts)
    exposed = [dest for _, dest in mounts]
    assert "/usr" in exposed
    prefix = os.path.realpath(sys.base_prefix)
    assert all(
        dest == "/usr" or dest in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32") or dest == prefix
        for dest in exposed
    )
    here = os.path.realpath(os.getcwd())
    assert not any(here.startswith(dest + "/") or here == dest for dest in exposed if dest != "/")
    for flag in (
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--clearenv",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in cmd
    assert cmd[cmd.index("--remount-ro") + 1] == "/"
    assert cmd.index("--remount-ro") > max(
        i for i, a in enumerate(cmd) if a in ("--ro-bind", "--tmpfs", "--dir")
    )


@pytest.mark.parametrize("field", ["timeout_s", "memory_mb", "max_processes", "output_limit_bytes"])
def test_limits_must_be_positive(field):
    with pytest.raises(ValueError, match=field):
        SandboxLimits(**{field: 0})


@pytest.mark.parametrize("field", ["timeout_s", "cpu_s"])
def test_limits_past_a_day_are_refused_before_a_timer_overflows(field):
    with pytest.raises(ValueError, match=f"{field} must be at most 86400"):
        SandboxLimits(**{field: 1e10})
    assert SandboxLimits(**{field: 86400}).timeout_s > 0


def test_cpu_limit_defaults_just_behind_the_wall_clock():
    job = SandboxLimits(timeout_s=4).job(4.0, isolate=True)
    assert job["cpu_s"] == 5.0 and job["isolate"] is True
