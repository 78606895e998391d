"""Host side of the sandbox: start one warm bubblewrap sandbox per worker and run jobs in it.

A fresh `bwrap` + interpreter per completion would cost more than the program under test (an
interpreter start is ~15 ms, namespaces a few more). Instead each worker keeps one sandbox alive: a
zygote (see `harness.py`) that forks a fresh, namespaced runner per job in a few milliseconds, so
scoring is cheaper than a bare `python -c` subprocess while each job still starts from a pristine
process and leaves nothing behind.

What the sandbox sees: /usr (and the /bin, /lib symlinks) and the interpreter's own install prefix,
read-only; a private /proc and /dev; per job a fresh tmpfs /tmp as its work dir; an empty environment;
no network (a new network namespace holds only a loopback interface of its own). The project, the
checkpoints and home directories are not mounted. Under root the sandbox drops to an unprivileged uid
(`SANDBOX_UID`), because the kernel does not enforce the process limit on uid 0.

Where bubblewrap is missing, `Sandbox` refuses to start unless `unsafe_local=True`, which runs the same
zygote as a plain subprocess (rlimits and the verdict split still apply, isolation does not) and warns.
Under root, unsafe mode still drops to `SANDBOX_UID`: as root, one `os.kill(-1, SIGKILL)` in a
completion would take down every process on the machine, and a fork bomb would meet no limit.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from megatron_rl.reward import testplan, wire
from megatron_rl.reward.memcg import RUNNER_OVERHEAD_MB, JobCgroup

log = logging.getLogger(__name__)

_PLANS: dict[tuple[str, str | None], dict] = {}  # tests' plans, wire form, shared by all sandboxes
_PLANS_LOCK = threading.Lock()
SANDBOX_UID = SANDBOX_GID = 61000  # what a root host runs sandboxes as; any unused, unprivileged id
_RUNTIME_MODULES = (
    "wire",
    "assertsites",
    "proof",
    "testshape",
    "testplan",
    "testrunner",
    "seccomp",
    "jobproc",
    "channel",
    "stdio",
    "solution",
    "harness",
)
_BOOT = """\
import sys, types
def _load(name, src):
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in sys.modules:
            sys.modules[pkg] = types.ModuleType(pkg)
            sys.modules[pkg].__path__ = []
    mod = types.ModuleType(name)
    mod.__file__ = "<sandbox>/" + parts[-1] + ".py"
    sys.modules[name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    setattr(sys.modules[".".join(parts[:-1])], parts[-1], mod)
for _name, _src in SOURCES:
    _load(_name, _src)
del SOURCES, PACKED, _name, _src  # compiled now: no job needs to map the sources (harness._trim)
sys.modules["megatron_rl.reward.harness"].zygote_main(sys.argv[1:])
"""
UNSAFE_WARNING = (
    "UNSAFE: reward code is running WITHOUT a sandbox (reward.unsafe_local=true). Model-written "
    "programs can read and delete your files, reach the network and kill processes. Install "
    "bubblewrap (sudo tools/setup_system.sh) and set reward.unsafe_local=false."
)


# The longest wall-clock limit a job may have: a day, past any test a run could wait for. Past it the
# timers overflow (RLIMIT_CPU, select(); `reward.timeout_s=1e10` ended in an OverflowError). The recipe's
# reward.timeout_s (check_ranges) and a problem's own timeout_s (data/problems) are held to it.
MAX_TIMEOUT_S = 24 * 3600


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot start here; the message says why and what to install or set."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-job limits. `cpu_s` defaults to the wall timeout plus one second (the wall clock fires first)."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    cpu_s: float | None = None
    max_processes: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    tmp_mb: int = 64
    output_limit_bytes: int = 1 << 20
    output_tail_bytes: int = 2048

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"SandboxLimits.{name} must be a finite number > 0; got {value}")
        for name in ("timeout_s", "cpu_s"):
            value = getattr(self, name)
            if value is not None and value > MAX_TIMEOUT_S:
                raise ValueError(
                    f"SandboxLimits.{name} must be at most {MAX_TIMEOUT_S} s (a day); got {value}"
                )

    def job(self, timeout_s: float, isolate: bool) -> dict[str, Any]:
        return {
            "timeout_s": timeout_s,
            "cpu_s": self.cpu_s if self.cpu_s is not None else timeout_s + 1.0,
            "memory_mb": self.memory_mb,
            "max_processes": self.max_processes,
            "max_file_mb": self.max_file_mb,
            "max_open_files": self.max_open_files,
            "tmp_mb": self.tmp_mb,
            "output_limit": self.output_limit_bytes,
            "tail_bytes": self.output_tail_bytes,
            "isolate": isolate,
        }


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def require_sandbox(unsafe_local: bool) -> str | None:
    """The bwrap path, or None for unsafe local mode (warned); raises when neither is allowed."""
    if unsafe_local:
        warnings.warn(UNSAFE_WARNING, RuntimeWarning, stacklevel=3)
        log.warning(UNSAFE_WARNING)
        print(f"\n!!! {UNSAFE_WARNING}\n", file=sys.stderr, flush=True)
        return None
    path = find_bwrap()
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (`bwrap`) is not installed, and completions are untrusted code that must not run "
            "unsandboxed. Install it with `sudo tools/setup_system.sh` (Debian/Ubuntu: `apt-get install "
            "bubblewrap`), or set reward.unsafe_local=true to run them without isolation (dangerous)."
        )
    return path


def _bootstrap_source() -> str:
    """The runtime's sources, compressed: one command-line argument may not exceed 128 KiB on Linux
    (MAX_ARG_STRLEN), which the plain sources would."""
    here = Path(__file__).parent
    sources = [(f"megatron_rl.reward.{m}", (here / f"{m}.py").read_text()) for m in _RUNTIME_MODULES]
    packed = base64.b85encode(zlib.compress(json.dumps(sources).encode(), 9)).decode()
    unpack = "import base64, json, zlib\nSOURCES = json.loads(zlib.decompress(base64.b85decode(PACKED)))\n"
    return f"PACKED = {packed!r}\n{unpack}{_BOOT}"


def _interpreter() -> tuple[str, list[str]]:
    """This interpreter's real path and the install prefixes to mount (those outside /usr)."""
    exe = os.path.realpath(sys.executable)
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if not any(exe.startswith(p + os.sep) for p in prefixes):
        prefixes.add(os.path.dirname(os.path.dirname(exe)))
    return exe, sorted(p for p in prefixes if p != "/usr" and not p.startswith("/usr/"))


def bwrap_command(bwrap: str, ctrl_fd: int, limits: SandboxLimits | None = None) -> list[str]:
    """The bubblewrap command line for one warm sandbox."""
    as_root = os.geteuid() == 0
    exe, prefixes = _interpreter()
    cmd = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-net"]
    cmd += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if as_root:  # no user namespace (it would map to uid 0); the zygote drops to SANDBOX_UID itself
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    for prefix in prefixes:
        # bwrap would create the missing parents (/root, /root/.pyenv ...) as 0700, which an
        # unprivileged sandbox cannot traverse: create them 0755 first.
        parents = Path(prefix).parents
        for parent in reversed([str(p) for p in parents if str(p) != "/"]):
            cmd += ["--perms", "0755", "--dir", parent]
        cmd += ["--ro-bind", prefix, prefix]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp"]
    return [*cmd, "--clearenv", exe, *_zygote_args(ctrl_fd, limits or SandboxLimits(), True)]


def _zygote_args(ctrl_fd: int, limits: SandboxLimits, isolate: bool) -> list[str]:
    """The interpreter's arguments: the runtime as source, and the zygote's settings."""
    args = ["-I", "-S", "-B", "-c", _bootstrap_source(), "--ctrl-fd", str(ctrl_fd)]
    args += ["--tmp-mb", str(limits.tmp_mb), "--isolate", "1" if isolate else "0"]
    if os.geteuid() == 0:
        args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    return args


class Sandbox:
    """One warm sandbox serving one job at a time. Not thread-safe: one worker thread owns it."""

    def __init__(self, limits: SandboxLimits | None = None, *, bwrap: str | None = None) -> None:
        """`bwrap=None` means unsafe local mode; callers get the path from `require_sandbox`."""
        self.limits = limits or SandboxLimits()
        self.bwrap = bwrap
        self._proc: subprocess.Popen | None = None
        self._ctrl: socket.socket | None = None
        self._stderr: Any = None
        self._cgroup: JobCgroup | None = None
        self._cgroup_tried = False
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The bubblewrap (or, unsafe, zygote) process: killing it ends the whole sandbox."""
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        self.close(keep_cgroup=True)
        if not self._cgroup_tried:
            self._cgroup_tried = True
            self._cgroup = JobCgroup.create(self.limits.memory_mb + RUNNER_OVERHEAD_MB)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        if self.bwrap:
            cmd = bwrap_command(self.bwrap, fd, self.limits)
        else:
            cmd = [os.path.realpath(sys.executable), *_zygote_args(fd, self.limits, False)]
        if self._cgroup is not None:  # a shell joins the cgroup, then becomes the sandbox (memcg.py)
            cmd = ["/bin/sh", "-c", 'echo 0 > "$0" && exec "$@"', str(self._cgroup.procs), *cmd]
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                cmd,
                pass_fds=[fd],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
                env={},
                cwd="/",
                start_new_session=True,
            )
        finally:
            theirs.close()
        self._ctrl = ours
        self.starts += 1
        ours.settimeout(timeout)
        try:
            ready = json.loads(ours.recv(1 << 16) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if not ready.get("ready"):
            why = ready.get("error") or self._stderr_text() or "the sandbox exited at start"
            self.close()
            raise SandboxUnavailable(
                f"the reward sandbox failed to start: {why.strip()}\n"
                "bubblewrap needs user namespaces (kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 "
                "also an AppArmor profile allowing bwrap). Check with: bwrap --unshare-all --ro-bind / / true"
            )

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-4000:].decode(errors="replace")

    def run(
        self,
        code: str,
        tests: str,
        entry_point: str | None = None,
        timeout_s: float | None = None,
        io_tests: Sequence[tuple[str, str]] = (),
        prefix: str = "",
        interface: Sequence[str] = (),
    ) -> dict:
        """Run `tests` against `code`. Returns status, passed, total, output_tail, seconds.

        `prefix` is the problem's own code (HumanEval's prompt): `code` already holds it where the
        completion needs it (`data/extract.compose_program`); the test runner runs it too, for the
        names the tests read from it (testplan rule 6). With `io_tests` ((stdin, expected stdout)
        pairs; `tests` is then ignored), `code` is a program run once per pair and judged by what it
        prints (`stdio.py`)."""
        timeout = float(timeout_s if timeout_s is not None else self.limits.timeout_s)
        if not (0 < timeout <= MAX_TIMEOUT_S):  # a problem's own timeout_s (Problem checks it too)
            raise ValueError(f"a job's timeout must be in (0, {MAX_TIMEOUT_S}] s; got {timeout}")
        if not self.alive:
            self.start()
        assert self._ctrl is not None
        start = time.monotonic()
        # Behind the runner's own deadline: time for it to kill the solution and report.
        hard_deadline = start + timeout + 3.0 + 0.1 * timeout
        sol_r, sol_w = os.pipe()
        tests_r, tests_w = os.pipe()
        res_r, res_w = os.pipe()
        job = json.dumps(self.limits.job(timeout, isolate=self.bwrap is not None)).encode()
        try:
            sent = self._send_job(job, [sol_r, tests_r, res_w])
        finally:
            for fd in (sol_r, tests_r, res_w):
                os.close(fd)
        record = None
        if sent:
            if io_tests:
                payloads = [{"code": code, "stdio": True}, {"io": [[i, o] for i, o in io_tests]}]
            else:
                planned = self._tests_payload(tests, entry_point, prefix, tuple(interface))
                payloads = [{"code": code, "names": planned["names"]}, planned]
            for fd, payload in zip((sol_w, tests_w), payloads):
                os.set_blocking(fd, False)
                try:
                    wire.write_all(fd, wire.pack(payload), hard_deadline)
                except (OSError, wire.FrameTimeout, wire.WireError):
                    # The job ended before reading it (it reports why), is stuck (the deadline says),
                    # or the payload is over the frame limit (the job sees no code and fails its tests).
                    pass
            os.close(sol_w)
            os.close(tests_w)
            os.set_blocking(res_r, False)
            try:
                record = wire.read_frame(res_r, hard_deadline)
            except (wire.FrameTimeout, wire.WireError):
                record = None
            done = self._wait_done(hard_deadline + 2.0)
        else:
            os.close(sol_w)
            os.close(tests_w)
            done = False
        os.close(res_r)
        oom_killed = self._cgroup is not None and self._cgroup.new_oom_kills() > 0
        if record is None or not done:
            timed_out = time.monotonic() >= hard_deadline
            self.kill()
            why = "the sandbox did not answer in time" if timed_out else "the sandbox died"
            record = {
                "status": "timeout" if timed_out else "sandbox_error",
                "passed": 0,
                "total": 0,
                "output_tail": f"{why}; restarted it. {self._stderr_text()[-1000:]}",
            }
        if oom_killed and record.get("status") != "passed":
            # The kernel ended a process of the job (or the zygote) at the cgroup's limit: the
            # program's memory, not a crash of its own, nor of the sandbox.
            note = f"the job exceeded its memory limit ({self.limits.memory_mb} MiB); the kernel killed it"
            record["status"] = "memory"
            record["output_tail"] = f"{record.get('output_tail', '')}\n{note}".strip()
        record["seconds"] = time.monotonic() - start
        return record

    def _tests_payload(self, tests: str, entry_point: str | None, prefix: str, interface: tuple) -> dict:
        """The tests as the runner needs them: planned here once per problem (cached), else as source.

        `names` in the result are the plan's solution names (the entry point, given or inferred from the
        tests, and the declared interface): the solution process announces those alone."""
        key = (tests, entry_point, prefix, interface)
        payload = _PLANS.get(key)
        if payload is None:
            try:
                plan = testplan.plan_tests(tests, entry_point, prefix, interface)
                payload = {"plan": testplan.plan_to_wire(plan), "names": plan.solution_names}
            except (SyntaxError, ValueError):  # the runner reports it, as for any unusable tests
                names = [n for n in (entry_point, *interface) if n]
                payload = {"tests": tests, "prefix": prefix, "entry_point": entry_point, "names": names}
            with _PLANS_LOCK:  # worker threads share the cache
                if len(_PLANS) >= 4096:
                    _PLANS.pop(next(iter(_PLANS)))
                _PLANS[key] = payload
        return payload

    def _send_job(self, job: bytes, fds: list[int]) -> bool:
        """Hand the job to the zygote; if the sandbox died while idle, restart it once and retry."""
        for attempt in range(2):
            try:
                assert self._ctrl is not None
                socket.send_fds(self._ctrl, [job], fds)
                return True
            except OSError:
                if attempt == 0:
                    self.start()
        return False

    def _wait_done(self, deadline: float) -> bool:
        """Wait for the zygote's word that the job's processes are all gone."""
        assert self._ctrl is not None
        try:
            self._ctrl.settimeout(max(0.01, deadline - time.monotonic()))
            msg = self._ctrl.recv(1 << 12)
        except OSError:
            return False
        return bool(msg) and "done" in json.loads(msg)

    def kill(self) -> None:
        """Kill the whole sandbox: every process in it dies with bubblewrap's PID namespace."""
        if self._proc is not None and self._proc.poll() is None:
            if self.bwrap is None:
                _kill_tree(self._proc.pid)
            else:
                self._proc.kill()
            self._proc.wait()
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None

    def close(self, keep_cgroup: bool = False) -> None:
        """Stop the sandbox: closing the control socket ends the zygote; kill if it lingers."""
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.kill()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._cgroup is not None and not keep_cgroup:
            self._cgroup.remove()
            self._cgroup, self._cgroup_tried = None, False

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_tree(pid: int) -> None:
    """Unsafe mode: SIGKILL a process and every descendant (no PID namespace does it for us)."""
    import psutil  # only the unsafe mode needs it

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def default_workers() -> int:
    """The CPU budget of this process: one sandbox per usable core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
