"""`make demo` on a fresh clone checks every prerequisite before building anything (`make prereqs`:
tools/check_prereqs.sh, which runs tools/setup_system.sh; its `--check` mode is tested on its own below).

The clone gets this working tree's Makefile and tools/ (the files under test, committed or not). PATH is
restricted to a folder of links to the few commands the Makefile needs, so `bwrap` cannot be found, and
installing is forbidden (MEGATRON_RL_NO_INSTALL=1, or a non-root user): the run must stop within seconds
with one line that says what to run, and leave no .venv behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.launch import REPO

TOOLS = (
    "bash",
    "sh",
    "make",
    "python3",
    "id",
    "env",
    "dirname",
    "df",
    "awk",
    "sed",
    "grep",
    "cat",
    "date",
    "apt-get",
)
SYSTEM = ("bwrap", "slurmctld", "munged")


@pytest.fixture
def clone():
    # Not pytest's tmp_path: its parent is private to root, and one case runs as an unprivileged user.
    base = Path(tempfile.mkdtemp(prefix="megatron-rl-clone-"))
    base.chmod(0o755)
    dest = base / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    # A committed .venv (a worktree's link to a shared venv, say) would let `make` install into whatever
    # it points at: stop before any make runs.
    assert not (dest / ".venv").exists() and not (dest / ".venv").is_symlink(), "the repository tracks .venv"
    shutil.copy(REPO / "Makefile", dest / "Makefile")
    for script in (REPO / "tools").glob("*.sh"):
        shutil.copy(script, dest / "tools" / script.name)
    yield dest
    shutil.rmtree(base, ignore_errors=True)


def _bin(folder: Path, extra: tuple[str, ...] = ()) -> str:
    """A PATH of links to TOOLS (+ extra); everything else, bwrap included, is out of sight."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.parent.chmod(0o755)
    folder.chmod(0o755)
    for name in (*TOOLS, *extra):
        # python3: the interpreter this venv was built from (a version manager's shim needs its own PATH).
        real = os.path.realpath(sys.executable) if name == "python3" else shutil.which(name)
        if real is None:
            pytest.skip(f"{name} is not installed here")
        (folder / name).symlink_to(real)
    return str(folder)


def _make(clone: Path, target: str, path: str, as_nobody: bool = False, **env) -> tuple[int, str, float]:
    cmd = ["make", "-s", target]
    if as_nobody:
        setpriv = shutil.which("setpriv")
        if setpriv is None or os.getuid() != 0:
            pytest.skip("needs root and setpriv to run as another user")
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd,
        cwd=clone,
        env={"PATH": path, "HOME": str(clone), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def _ours(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("megatron-rl:")]


def test_demo_without_bwrap_fails_fast_with_one_line_and_builds_nothing(clone):
    rc, out, seconds = _make(clone, "demo", _bin(clone.parent / "bin"), MEGATRON_RL_NO_INSTALL="1")
    assert rc != 0, out
    assert seconds < 10, f"took {seconds:.1f} s"
    lines = _ours(out)
    assert len(lines) == 1, out
    assert "bwrap (bubblewrap)" in lines[0] and lines[0].endswith("run: make system"), lines[0]
    assert not (clone / ".venv").exists(), "a .venv was built before the check failed"


def test_as_a_user_without_root_the_line_says_sudo(clone):
    rc, out, _ = _make(clone, "demo", _bin(clone.parent / "bin"), as_nobody=True)
    assert rc != 0, out
    lines = _ours(out)
    assert len(lines) == 1 and lines[0].endswith("run: sudo make system"), out
    assert not (clone / ".venv").exists()


def test_test_target_checks_the_same_prerequisites(clone):
    rc, out, seconds = _make(clone, "test", _bin(clone.parent / "bin"), MEGATRON_RL_NO_INSTALL="1")
    assert rc != 0 and seconds < 10, out
    assert len(_ours(out)) == 1 and not (clone / ".venv").exists(), out


def test_the_check_passes_when_every_package_is_there(clone):
    """The counterpart: the same restricted PATH plus the real sandbox and Slurm commands passes."""
    if any(shutil.which(c) is None for c in SYSTEM):
        pytest.skip("the system packages are not installed here (make system)")
    rc, out, _ = _make(clone, "prereqs", _bin(clone.parent / "bin", SYSTEM), MEGATRON_RL_NO_INSTALL="1")
    assert rc == 0, out
    assert _ours(out) == [], out


def test_a_python_without_venv_is_named_before_building(clone):
    """An interpreter that cannot build .venv is refused in the same one-line way (PY= is the knob)."""
    fake = clone.parent / "oldpy"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    rc, out, _ = _make(
        clone, "demo", _bin(clone.parent / "bin", SYSTEM), MEGATRON_RL_NO_INSTALL="1", PY=str(fake)
    )
    assert rc != 0
    lines = _ours(out)
    assert len(lines) == 1 and "cannot build .venv" in lines[0], out
    assert not (clone / ".venv").exists()


def test_a_bwrap_that_cannot_unshare_is_named_with_the_fix(clone):
    """bwrap installed but user namespaces blocked (Ubuntu 24.04 AppArmor): one line naming the sysctl."""
    if any(shutil.which(c) is None for c in SYSTEM):
        pytest.skip("the system packages are not installed here (make system)")
    folder = Path(_bin(clone.parent / "bin", tuple(c for c in SYSTEM if c != "bwrap")))
    fake = folder / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    rc, out, seconds = _make(clone, "demo", str(folder), MEGATRON_RL_NO_INSTALL="1")
    assert rc != 0 and seconds < 10, out
    lines = _ours(out)
    assert len(lines) == 1, out
    assert "uid map: Permission denied" in lines[0] and "kernel.unprivileged_userns_clone" in lines[0], out
    assert "apparmor_restrict_unprivileged_userns" in lines[0], out
    assert not (clone / ".venv").exists()


def test_setup_system_check_installs_nothing_and_names_what_is_missing(tmp_path):
    """`tools/setup_system.sh --check` installs nothing even as root with apt-get on PATH (here a stand-in
    that records a call): every missing command is named in one line, exit 1; with them all there, exit 0
    and nothing printed."""
    folder = Path(_bin(tmp_path / "bin"))
    calls = tmp_path / "apt-get-calls"
    (folder / "apt-get").unlink()
    (folder / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    (folder / "apt-get").chmod(0o755)

    def check(path: str) -> subprocess.CompletedProcess:
        cmd = ["bash", str(REPO / "tools" / "setup_system.sh"), "--check"]
        return subprocess.run(
            cmd, env={"PATH": path, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60
        )

    proc = check(str(folder))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = _ours(proc.stdout + proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("megatron-rl: missing system packages: "), proc.stderr
    for named in ("bwrap (bubblewrap)", "slurmctld (slurm-wlm)", "munged (munge)"):
        assert named in lines[0], lines[0]
    assert not calls.exists(), f"--check ran apt-get: {calls.read_text()}"
    if all(shutil.which(c) for c in SYSTEM):
        everything = _bin(tmp_path / "all", SYSTEM)
        done = check(everything)
        assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
