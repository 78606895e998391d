"""Problems judged by stdin/stdout pairs: run the program once per pair, compare what it printed.

Standard library only: `sandbox.py` ships this module into the sandbox with the rest of the runtime.
Most competitive-programming sets (APPS, CodeContests, TACO) judge a whole program, not a function:
each test is an input fed on stdin and the output expected on stdout.

The split of `harness.py` holds: the solution process U never sees an expected output.
- U compiles the program once (a syntax error is reported as for function tests), then serves one
  request per pair: it forks a fresh child with the pair's input on stdin (a memfd, so a program that
  reads nothing cannot block U) and its stdout on a pipe, and sends back what the child printed and
  how it ended. The child inherits U's rlimits and seccomp filter; its stderr goes to the job's
  output tail. Every case starts from the pristine compiled program: module state does not carry
  over, so a program cannot count its runs in a global. (Files it writes in the job's /tmp do carry
  over, but they can only hold inputs, which are not secret.)
- The test runner T holds the expected outputs and compares, on plain strings decoded from the
  reply. A reply is only what the program printed: it cannot claim a verdict.

A case passes when the program exits with status 0 (`sys.exit()`/`sys.exit(0)` included) within the
job's deadline and its stdout matches the expected output under `same_output`. The problem's timeout
bounds the whole run, every case together, as it does for function tests: a program that hangs on
case 3 of 5 passes at most 2 of them (the rest fail at once), and the status is `timeout`.
"""

from __future__ import annotations

import io
import os
import select
import signal
import sys
from types import CodeType
from typing import Any

from megatron_rl.reward import testrunner, wire
from megatron_rl.reward.channel import signal_name

_MEMORY_EXIT = 121  # a child's exit code for MemoryError: reported `memory` rather than a plain failure


def normalize_output(text: str) -> str:
    """The text as compared: line endings as \\n, trailing whitespace of each line and trailing blank
    lines dropped. Leading and inner whitespace, letter case and number formatting all count."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def same_output(actual: str, expected: str) -> bool:
    """Whether a program's stdout matches the expected output (see `normalize_output`)."""
    return normalize_output(actual) == normalize_output(expected)


# ---- U: run the program once per request -----------------------------------------------------


def serve_programs(code: CodeType, req_r: int, resp_w: int, output_limit: int) -> None:
    """U's loop in stdio mode: one request `{"stdin": text}` per pair, one reply each. Never returns."""
    limit = max(1, min(output_limit, wire.MAX_FRAME // 2))
    while True:
        req = wire.read_frame(req_r)
        if req is None:
            os._exit(0)
        stdin = req.get("stdin") if isinstance(req, dict) else None
        reply = _run_once(code, stdin if isinstance(stdin, str) else "", limit, (req_r, resp_w))
        wire.send_frame(resp_w, reply)


def _run_once(code: CodeType, stdin: str, limit: int, close_in_child: tuple[int, ...]) -> dict:
    """Run the program once in a fresh child: a memfd holds its stdin, so a program that reads nothing
    (or little) cannot block U on a full pipe; U's own protocol fds are closed in the child."""
    stdin_fd = os.memfd_create("stdin")
    data = stdin.encode("utf-8", errors="surrogatepass")
    view = memoryview(data)
    while view:
        view = view[os.write(stdin_fd, view) :]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            for fd in (stdin_fd, out_r, out_w, *close_in_child):
                os.close(fd)
            _program_main(code)
        finally:
            os._exit(70)
    os.close(stdin_fd)
    os.close(out_w)
    stdout, flooded = _collect(pid, out_r, limit)
    os.close(out_r)
    if flooded:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    text = stdout.decode("utf-8", errors="replace")
    return {"stdout": text, "exit": os.waitstatus_to_exitcode(status), "flooded": flooded}


def _collect(pid: int, out_r: int, limit: int) -> tuple[bytes, bool]:
    """The child's stdout until EOF, or until it exits (a grandchild holding the pipe does not pin U).

    Returns what it printed (at most `limit` bytes) and whether it printed more than that."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernels before 5.3: poll for the exit without reaping
        pidfd = None
    out = bytearray()
    exited = False
    try:
        while True:
            fds = [out_r] + ([pidfd] if pidfd is not None else [])
            ready = select.select(fds, [], [], None if pidfd is not None else 0.02)[0]
            if not exited and (
                pidfd in ready
                if pidfd is not None
                else os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            ):
                exited = True
                os.set_blocking(out_r, False)  # drain what is buffered, then stop
            if out_r in ready or exited:
                try:
                    chunk = os.read(out_r, 1 << 16)
                except BlockingIOError:
                    chunk = b""
                if not chunk:
                    return bytes(out), False
                out += chunk
                if len(out) > limit:
                    return bytes(out[:limit]), True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _program_main(code: CodeType) -> None:
    """The child: fresh std streams on fds 0 and 1, the program as `__main__`, its exit status."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="surrogateescape"
    )
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="backslashreplace"
    )
    status = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if isinstance(e.code, int):
            status = e.code & 0xFF
        elif e.code is not None:
            print(e.code, file=sys.stderr)
            status = 1
    except MemoryError:
        status = _MEMORY_EXIT
    except BaseException as e:
        print_exception(e, e.__traceback__.tb_next if e.__traceback__ else None)  # the program's frames on
        status = 1
    if not flush_output():
        status = status or 1  # output that could not be written is not output
    os._exit(status)


# ---- T: compare, case by case -------------------------------------------------------------------


def run_pairs(pairs: Any, channel: Any) -> tuple[testrunner.RunOutcome, str | None]:
    """Run every pair through U (via `channel.exchange`), compare in T. Returns the outcome and a status
    hint (`timeout` or `memory`) when a case ended that way; None when each case passed or failed."""
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs
    ):
        return testrunner.RunOutcome(0, 0, ["unusable stdin/stdout tests"]), None
    passed, failures, hint = 0, [], None
    for index, (stdin, expected) in enumerate(pairs, 1):
        try:
            reply = channel.exchange({"op": "run", "stdin": stdin})
        except (testrunner.JobTimeout, testrunner.SolutionGone) as e:
            failures.append(f"test {index} failed: {type(e).__name__}: {e}")
            if index < len(pairs):
                why = "time is up" if isinstance(e, testrunner.JobTimeout) else "the solution process is gone"
                failures.append(f"tests {index + 1} to {len(pairs)} not run: {why}")
            return testrunner.RunOutcome(passed, len(pairs), failures), hint
        verdict = _judge(reply, expected)
        if verdict is None:
            passed += 1
            continue
        failures.append(f"test {index} failed: {verdict}")
        code = reply.get("exit") if isinstance(reply, dict) else None
        if code == _MEMORY_EXIT:
            hint = "memory"
        elif code == -signal.SIGXCPU:
            hint = hint or "timeout"  # the CPU-seconds limit
    return testrunner.RunOutcome(passed, len(pairs), failures), hint


def _judge(reply: Any, expected: str) -> str | None:
    """None when the case passed; else why it failed."""
    if not isinstance(reply, dict) or not isinstance(reply.get("stdout"), str):
        return "malformed reply from the solution process"
    code = reply.get("exit")
    if reply.get("flooded") is True:
        return "stdout exceeded the output limit"
    if code == _MEMORY_EXIT:
        return "MemoryError"
    if type(code) is not int or code != 0:
        how = (
            f"killed by {signal_name(-code)}"
            if type(code) is int and code < 0
            else f"exited with code {code}"
        )
        return f"the program {how}"
    actual = reply["stdout"]
    if same_output(actual, expected):
        return None
    got, want = normalize_output(actual).split("\n"), normalize_output(expected).split("\n")
    for line, (g, w) in enumerate(zip(got, want), 1):
        if g != w:
            return f"stdout line {line}: expected {w[:80]!r}, got {g[:80]!r}"
    return f"stdout has {len(got)} lines, expected {len(want)}"


def print_exception(e: BaseException, tb=None) -> None:
    """A program's error on its stderr (the job's output tail), its last three frames from `tb`
    (default: all of them); a hostile exception whose `__str__` raises gets its type name alone."""
    try:
        import traceback  # here, not in the zygote, whose every job would map it (harness._trim)

        traceback.print_exception(
            type(e), e, tb if tb is not None else e.__traceback__, limit=-3, file=sys.stderr
        )
    except BaseException:
        try:
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
        except BaseException:
            pass


def flush_output() -> bool:
    """Flush the program's stdout and stderr; False when either could not be written."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            ok = False
    return ok
