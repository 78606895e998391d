"""Where a rank's output goes: everything into the run's `log.txt`, a short account on the terminal.

Third-party libraries (megatron-core, vLLM, torch, W&B) write warnings, config dumps and per-rank
chatter straight to file descriptors 1 and 2, from Python and from C, so the descriptors themselves are
redirected (not just `sys.stdout`); child processes such as the reward sandbox inherit the redirection.
A small child process (the "tee") copies the pipe into `log.txt` line by line with a `[rankN]` prefix
(all ranks append to the one file, O_APPEND). It is a process, not a thread, so that a rank's sudden
death (abort(), SIGSEGV, the OOM killer) does not take the last lines with it: an NCCL watchdog timeout,
a CUDA error or a faulthandler dump still in the pipe is drained into log.txt once the rank is gone (the
tee ignores SIGINT/SIGTERM and ends at end of file). The launcher then shows the failed rank's last lines. The terminal keeps what a user acts on: rank 0's header, progress bar and closing summary,
rank 0's warnings from our own `megatron_rl` loggers, and every rank's errors (uncaught exceptions,
`SystemExit` messages, errors logged by our code). `--verbose` or MEGATRON_RL_VERBOSE=1 copies every
line to the terminal as well.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

VERBOSE_ENV = "MEGATRON_RL_VERBOSE"
_active: Console | None = None

# The tee: pipe (stdin) -> log.txt (stdout, opened O_APPEND) with the prefix, and the terminal (stderr)
# when verbose. It outlives the rank: it ends at end of file, or a few seconds of quiet after its parent
# died while something else (an orphaned grandchild) still holds the pipe open.
_TEE = r"""
import os, select, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(s, signal.SIG_IGN)
prefix, verbose, parent = sys.argv[1].encode(), sys.argv[2] == "1", os.getppid()
def emit(lines):
    # A progress bar redraws with a carriage return: keep only its last state.
    text = b"".join(prefix + line.rsplit(b"\r", 1)[-1] + b"\n" for line in lines)
    os.write(1, text)
    if verbose:
        try:
            os.write(2, text)
        except OSError:
            pass
pending, quiet = b"", 0.0
while True:
    ready, _, _ = select.select([0], [], [], 1.0)
    if not ready:
        quiet = quiet + 1.0 if os.getppid() != parent else 0.0
        if quiet >= 5.0:
            break
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    quiet = 0.0
    pending += chunk
    *lines, pending = pending.split(b"\n")
    if lines:
        emit(lines)
if pending:
    emit([pending])
"""


def verbose_requested() -> bool:
    return os.environ.get(VERBOSE_ENV, "0").lower() not in ("", "0", "false", "no")


class Console:
    """One rank's redirection of fds 1 and 2 into `log_path`, and a handle on the real terminal."""

    def __init__(self, log_path: Path, rank: int, verbose: bool):
        self.log_path, self.rank, self.verbose = Path(log_path), rank, verbose
        self.prefix = f"[rank{rank}] ".encode()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self._saved = (os.dup(1), os.dup(2))
        self.terminal: TextIO = os.fdopen(os.dup(self._saved[1]), "w", buffering=1, closefd=True)
        read_fd, self._write_fd = os.pipe()
        self._tee = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _TEE, self.prefix.decode(), "1" if verbose else "0"],
            stdin=read_fd,
            stdout=self._log_fd,
            stderr=self._saved[1],
            close_fds=True,
        )
        os.close(read_fd)
        os.dup2(self._write_fd, 1)
        os.dup2(self._write_fd, 2)
        self._handler = _TerminalHandler(self)
        logging.getLogger("megatron_rl").addHandler(self._handler)
        self._closed = False

    # ---- what rank code calls -------------------------------------------------------------------
    def to_terminal(self, text: str) -> None:
        """Write to the terminal around a live progress bar (cleared, then redrawn below the text)."""
        try:
            from tqdm import tqdm

            around_bars = tqdm.external_write_mode(file=self.terminal)
        except ImportError:
            around_bars = contextlib.nullcontext()
        try:
            with around_bars:
                self.terminal.write(text)
                self.terminal.flush()
        except (OSError, ValueError):
            pass  # the terminal went away (a closed pipe): log.txt still has everything

    def say(self, text: str) -> None:
        """A line (or lines) for the terminal, also kept in log.txt."""
        self.to_terminal(text.rstrip("\n") + "\n")
        self._log_only(text)

    def error(self, text: str) -> None:
        """An error on any rank: on the terminal with its rank, and in log.txt."""
        lines = text.rstrip("\n").splitlines() or [""]
        self.to_terminal("".join(f"[rank{self.rank}] {line}\n" for line in lines))
        self._log_only(text)

    def _log_only(self, text: str) -> None:
        lines = text.rstrip("\n").encode().split(b"\n")
        os.write(self._log_fd, b"".join(self.prefix + line + b"\n" for line in lines))

    def close(self) -> None:
        """Give fds 1 and 2 back to the terminal, and drain the pipe into log.txt."""
        if self._closed:
            return
        self._closed = True
        logging.getLogger("megatron_rl").removeHandler(self._handler)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        os.close(self._write_fd)
        # Children (sandbox workers) may still hold the pipe open; do not wait on them for long (the tee
        # then finishes on its own when they go).
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._tee.wait(timeout=2.0)
        os.close(self._log_fd)
        self.terminal.flush()


class _TerminalHandler(logging.Handler):
    """Our own warnings (rank 0) and errors (every rank) on the terminal; the rest stays in log.txt."""

    def __init__(self, console: Console):
        super().__init__(level=logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if self.console.verbose:
            return  # the log line already reaches the terminal through the copy
        if record.levelno < logging.ERROR and self.console.rank != 0:
            return
        text = f"{record.levelname.lower()}: {record.getMessage()}\n"
        if record.levelno >= logging.ERROR:
            text = f"[rank{self.console.rank}] {text}"
        self.console.to_terminal(text)


def start(log_path: Path, rank: int, verbose: bool | None = None) -> Console:
    """Redirect this process's output into `log_path`; the console becomes `active()`."""
    global _active
    if _active is not None:
        return _active
    _active = Console(log_path, rank, verbose_requested() if verbose is None else verbose)
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        if _active is not None:
            _active.error("".join(traceback.format_exception(kind, value, tb)))
            return
        previous(kind, value, tb)

    sys.excepthook = excepthook
    # Entry points without run_guarded still drain the pipe into log.txt before the interpreter goes.
    atexit.register(stop)
    return _active


def active() -> Console | None:
    return _active


def stop() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None


def user_facing(e: BaseException) -> bool:
    """An error the user acts on (a full disk, a missing file, a bad config or input, no sandbox), as
    opposed to a bug: its message says what to do, and a traceback only hides it."""
    if isinstance(e, OSError | ValueError):  # NoSpaceError, RecipeNotFound, ConfigError, bad data, ...
        return True
    sandbox = sys.modules.get("megatron_rl.reward.sandbox")  # not imported here: it may never load
    return sandbox is not None and isinstance(e, sandbox.SandboxUnavailable)


def run_guarded(
    main: Callable[[], int], classify: Callable[[BaseException], tuple[int, str] | None] | None = None
) -> int:
    """Run a rank's main so that its errors reach the terminal even while output goes to log.txt.

    An uncaught exception turns into exit code 1, with its full traceback in log.txt (ending in an
    `error:` line, which the launcher shows for the rank that failed first). On the terminal: a
    user-facing error (see `user_facing`) is one `error: ...` line from rank 0 only (every rank usually
    hits the same one); any other exception is rank 0's traceback and one line from each other rank. A
    SystemExit with a message is re-raised after the terminal is given back, so Python prints it there.
    `classify` names the errors that are the machines' rather than the run's (a lost peer, a crashed
    engine): each such rank prints its one line and exits with the code `classify` gives, which the
    batch script's failover reads (system/failover.py).
    """
    try:
        return main()
    except SystemExit as e:
        if _active is not None and not isinstance(e.code, int | None):
            _active._log_only(f"exit: {e.code}")
        raise
    except Exception as e:
        if _active is None:
            raise
        known = classify(e) if classify is not None else None
        if known is not None:
            code, line = known
            _active._log_only(traceback.format_exc().rstrip("\n"))
            _active.error(f"error: {line}")
            return code
        line = str(e).strip() or type(e).__name__
        if isinstance(e, OSError) and e.strerror:  # without the "[Errno 28] " in front
            line = f"{e.strerror}: {e.filename}" if e.filename else e.strerror
        if not user_facing(e):
            line = f"{type(e).__name__}: {line}"
        _active._log_only(traceback.format_exc().rstrip("\n") + f"\nerror: {line}")
        if user_facing(e):
            if _active.rank == 0:
                _active.to_terminal(f"error: {line}\n")
        elif _active.rank == 0:
            _active.to_terminal(
                "".join(f"[rank0] {x}\n" for x in traceback.format_exc().rstrip("\n").splitlines())
            )
        else:
            _active.to_terminal(f"[rank{_active.rank}] {line} (traceback in log.txt)\n")
        return 1
    finally:
        stop()
