"""The test runner's line to the solution process: requests, replies, captured output, liveness.

Standard library only; runs inside the sandbox in the trusted test runner (T in `harness.py`). Every
byte read here comes from untrusted code, so reads are non-blocking, frames are size-checked before
they are buffered, output is kept only as a bounded tail, and every wait is bounded by the job's
deadline. Once the solution times out, dies, floods its output or breaks the protocol, the channel
is closed for good and each further request fails at once, so the remaining tests fail quickly.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from typing import Any

from megatron_rl.reward import testrunner, wire

_NOTHING = object()


def signal_name(number: int) -> str:
    """SIGKILL, SIGRTMIN+3, or "signal 77": real-time signals have no name in the `signal.Signals` enum."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
    if low <= number <= high:
        return f"SIGRTMIN+{number - low}" if number - low <= high - number else f"SIGRTMAX-{high - number}"
    return f"signal {number}"


class Channel:
    def __init__(self, pid: int, req_w: int, resp_r: int, out_r: int, deadline: float, job: dict) -> None:
        self.pid, self.req_w, self.resp_r, self.out_r = pid, req_w, resp_r, out_r
        self.deadline = deadline
        for fd in (req_w, resp_r, out_r):
            os.set_blocking(fd, False)
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # kernels before 5.3: poll waitpid instead
            self.pidfd = None
        self.timeout_s, self.cpu_s = job["timeout_s"], job["cpu_s"]
        self.output_limit, self.tail_bytes = job["output_limit"], job["tail_bytes"]
        self.inbox = bytearray()
        self.tail = bytearray()
        self.out_total = 0
        self.replies_closed = False
        self.state: str | None = None  # timeout | gone | flood | protocol
        self.memory_error = False
        self.exit_status: int | None = None
        self.cpu_used = 0.0

    # ---- requests --------------------------------------------------------------------------

    def request(self, op: list) -> Any:
        """Send one operation on a RemoteObject and return the decoded answer (or raise what U raised)."""
        kind, ref = op[0], op[1]
        msg: dict[str, Any] = {"op": kind, "ref": ref}
        try:
            if kind == "call":
                msg["args"] = wire.encode(op[2], self._handle_ref)
                msg["kwargs"] = wire.encode(op[3], self._handle_ref)
            elif kind == "get":
                msg["name"] = op[2]
            elif kind == "getitem":
                msg["key"] = wire.encode(op[2], self._handle_ref)
            elif kind == "set":
                msg["name"], msg["value"] = op[2], wire.encode(op[3], self._handle_ref)
        except wire.WireError as e:
            raise TypeError(f"cannot pass this to the solution: {e}") from None
        reply = self.exchange(msg)
        if isinstance(reply, dict):
            if isinstance(reply.get("raise"), list) and reply["raise"][:1] == ["MemoryError"]:
                self.memory_error = True
            if kind == "call" and "mutated" in reply:  # before what it raised: a mutation then a raise
                testrunner.apply_mutations(op[2], op[3], reply["mutated"], self._make_handle)
        return testrunner.decode_reply(reply, self._make_handle)

    def exchange(self, msg: dict) -> Any:
        """Send one request frame to U and return its reply frame as it came (untrusted, undecoded).

        Raises JobTimeout past the deadline and SolutionGone once U is dead or broke the protocol."""
        try:
            data = wire.pack(msg)
        except wire.WireError as e:
            raise TypeError(f"cannot pass this to the solution: {e}") from None
        self._raise_if_closed()
        try:
            wire.write_all(self.req_w, data, self.deadline)
        except wire.FrameTimeout:
            self._fail("timeout")
        except OSError:
            self._fail("gone")
        return self._next_frame()

    def wait_load(self) -> dict:
        """U's first message: whether the solution compiled and ran, and the names it defines."""
        try:
            msg = self._next_frame()
        except (testrunner.JobTimeout, testrunner.SolutionGone) as e:
            return {"load": "error", "type": type(e).__name__, "error": str(e)}
        if not isinstance(msg, dict) or "load" not in msg:
            self._close("protocol")
            return {"load": "error", "type": "ProtocolError", "error": "malformed load message"}
        if msg.get("type") == "MemoryError":
            self.memory_error = True
        return msg

    def _handle_ref(self, value: Any) -> dict:
        if isinstance(value, testrunner.RemoteObject):
            return {"$h": object.__getattribute__(value, "_ref")}
        raise wire.WireError(f"a {type(value).__name__} cannot be sent; tests pass plain values")

    def _make_handle(self, body: Any) -> testrunner.RemoteObject:
        if not isinstance(body, dict) or type(body.get("id")) is not int:
            raise wire.WireError("malformed handle")
        type_name = body.get("type") if isinstance(body.get("type"), str) else "object"
        truth = body.get("truth") if type(body.get("truth")) is bool else None
        return testrunner.RemoteObject(self.request, {"h": body["id"]}, type_name[:60], truth)

    # ---- the event loop ----------------------------------------------------------------------

    def _next_frame(self) -> Any:
        while True:
            frame = self._take_frame()
            if frame is not _NOTHING:
                return frame
            self._raise_if_closed()
            if self.replies_closed:
                self._fail("gone")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self._fail("timeout")
            fds = [self.resp_r, self.out_r] + ([self.pidfd] if self.pidfd is not None else [])
            wait = remaining if self.pidfd is not None else min(remaining, 0.02)
            ready = select.select(fds, [], [], wait)[0]
            if self.out_r in ready:
                self._read_output()
            if self.resp_r in ready:
                self._read_replies()
            if self.pidfd in ready or (self.pidfd is None and self._exited()):
                self._read_replies()  # its last words, e.g. a load error sent just before exiting
                frame = self._take_frame()
                self._reap()
                if frame is not _NOTHING:
                    return frame
                self._fail("gone")

    def _take_frame(self) -> Any:
        if len(self.inbox) < 4:
            return _NOTHING
        size = int.from_bytes(self.inbox[:4], "big")
        if size > wire.MAX_FRAME:
            self._fail("protocol")
        if len(self.inbox) < 4 + size:
            return _NOTHING
        body = bytes(self.inbox[4 : 4 + size])
        del self.inbox[: 4 + size]
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            self._fail("protocol")

    def _read_replies(self) -> None:
        while len(self.inbox) <= wire.MAX_FRAME + 4:
            try:
                chunk = os.read(self.resp_r, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.replies_closed = True
                return
            self.inbox += chunk

    def _read_output(self) -> None:
        while True:
            try:
                chunk = os.read(self.out_r, 1 << 16)
            except (BlockingIOError, OSError):
                return
            if not chunk:
                return
            self.out_total += len(chunk)
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.tail_bytes)]
            if self.out_total > self.output_limit:
                self._close("flood")
                return

    # ---- ending ------------------------------------------------------------------------------

    def _exited(self) -> bool:
        if self.exit_status is not None:
            return True
        pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            return False
        self._record_exit(status, usage)
        return True

    def _reap(self) -> None:
        if self.exit_status is None:
            _, status, usage = os.wait4(self.pid, 0)
            self._record_exit(status, usage)

    def _record_exit(self, status: int, usage: Any) -> None:
        self.exit_status = os.waitstatus_to_exitcode(status)
        self.cpu_used = usage.ru_utime + usage.ru_stime

    def _close(self, state: str) -> None:
        if self.state is None:
            self.state = state
        if self.exit_status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap()

    def _fail(self, state: str) -> None:
        self._close(state)
        self._raise_if_closed()

    def _raise_if_closed(self) -> None:
        if self.state == "timeout":
            raise testrunner.JobTimeout(f"no answer within the {self.timeout_s:g} s limit")
        if self.state is not None:
            raise testrunner.SolutionGone(self.note())

    def finish(self) -> None:
        """Kill the solution (if it still runs) and collect the last of its output."""
        self._close(self.state or "done")
        self._read_output()

    def status_override(self) -> str | None:
        """The status the channel's fate imposes, or None when the solution answered to the end."""
        if self.state == "timeout":
            return "timeout"
        if self.state == "flood":
            return "crashed"
        if self.state in ("gone", "protocol"):
            if self.cpu_used >= self.cpu_s - 0.05 or self.exit_status == -signal.SIGXCPU:
                return "timeout"
            return "memory" if self.memory_error else "crashed"
        return "memory" if self.memory_error else None

    def note(self) -> str:
        if self.state == "flood":
            return f"output limit of {self.output_limit} bytes exceeded"
        if self.state == "protocol":
            return "the solution process broke the reply protocol"
        if self.exit_status is not None and self.exit_status < 0:
            return f"solution process killed by signal {signal_name(-self.exit_status)}"
        return f"solution process exited (code {self.exit_status})"

    def tail_text(self, failures: list[str]) -> str:
        parts = []
        if self.tail:
            clipped = "[...]\n" if self.out_total > len(self.tail) else ""
            parts.append(clipped + self.tail.decode("utf-8", errors="replace"))
        if self.state in ("timeout", "flood", "gone", "protocol"):
            failures = [
                *failures,
                self.note() if self.state != "timeout" else f"timed out after {self.timeout_s:g} s",
            ]
        if failures:
            shown = failures[:8] + ([f"... and {len(failures) - 8} more"] if len(failures) > 8 else [])
            parts.append("\n".join(shown))
        return "\n".join(parts)[-2 * self.tail_bytes :]
