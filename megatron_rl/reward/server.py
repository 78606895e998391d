"""The reward pool served over HTTP: `megatron-rl reward-server`, one long-running process per CPU node.

A training job's engine leaders send each finished sample here (`remote.py`) instead of scoring it
in sandboxes on their own GPU nodes. Behind the HTTP layer is the same `RewardPool`: the same
bubblewrap sandbox, the same verdict split and limits, warm sandboxes kept across requests.

    GET  /health   no credentials: {"status": "ok", "kind", "function", "mode", "timeout_s", "memory_mb",
                   "workers", "capacity", "in_flight", "scored"}; a client checks the reward settings
                   against its recipe before it sends work
    POST /score    `Authorization: Bearer <token>`, the job's MEGATRON_RL_REWARD_TOKEN (401 without one,
                   403 with another: nobody else on the network submits code or reads results);
                   body {"id": any JSON value, "problem": {...}, "completion": "..."}; answers the
                   RewardResult as JSON with the request's id, 400 naming the field that is wrong, or
                   503 with Retry-After when `capacity` jobs are already queued or running (backpressure:
                   the client sends the job to another server, or again later)

Starlette on uvicorn (both in the lock: vLLM's OpenAI server is built on them). The server refuses to
start without a token: an open endpoint that runs arbitrary code is not a mode.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from megatron_rl.reward.problem import Problem
from megatron_rl.reward.result import RewardResult

log = logging.getLogger(__name__)

TOKEN_ENV = "MEGATRON_RL_REWARD_TOKEN"
_PROBLEM_FIELDS = ("id", "prompt", "tests", "entry_point", "timeout_s", "answer", "prefix")


def problem_to_wire(p: Problem) -> dict[str, Any]:
    """What of a Problem a server needs to grade it (its metadata stays with the job)."""
    out: dict[str, Any] = {k: getattr(p, k) for k in _PROBLEM_FIELDS}
    out["io_tests"] = [list(pair) for pair in p.io_tests]
    out["interface"] = list(p.interface)
    return out


def problem_from_wire(d: Any) -> Problem:
    """The Problem of a request's `problem`; ValueError naming what is wrong."""
    if not isinstance(d, dict):
        raise ValueError("'problem' must be an object")
    unknown = sorted(set(d) - {*_PROBLEM_FIELDS, "io_tests", "interface"})
    if unknown:
        raise ValueError(f"'problem' has unknown fields {unknown}")
    kwargs = {k: d[k] for k in _PROBLEM_FIELDS if k in d}
    io = d.get("io_tests", [])
    if not isinstance(io, list) or not all(isinstance(x, list) and len(x) == 2 for x in io):
        raise ValueError("'problem.io_tests' must be a list of [stdin, expected stdout] pairs")
    interface = d.get("interface", [])
    if not isinstance(interface, list):
        raise ValueError("'problem.interface' must be a list of names")
    try:
        return Problem(**kwargs, io_tests=tuple(tuple(x) for x in io), interface=tuple(interface))
    except TypeError as e:  # a field of the wrong type that Problem's own checks do not name
        raise ValueError(f"'problem': {e}") from None


class ScoreService:
    """The server's state: the pool it scores with, the job's token, the bound on jobs in flight."""

    def __init__(self, pool, token: str, capacity: int):
        self.check_token(token)
        if capacity < 1:
            raise ValueError(f"--queue must be at least 1; got {capacity}")
        self.pool, self.token, self.capacity = pool, token.encode(), capacity
        self.in_flight, self.scored = 0, 0
        self._lock = threading.Lock()

    @staticmethod
    def check_token(token: str) -> None:
        """Refuse an empty or guessable token: the server runs whatever code a holder sends."""
        if not token:
            raise ValueError(
                f"the reward server needs a token: set {TOKEN_ENV} (slurm/train.sbatch makes one per job) "
                "so that only the job can submit code and read results"
            )
        if len(token) < 16:
            raise ValueError(
                f"{TOKEN_ENV} is {len(token)} characters; use at least 16 (e.g. openssl rand -hex 16)"
            )

    def health(self) -> dict[str, Any]:
        cfg = self.pool.cfg
        with self._lock:
            in_flight, scored = self.in_flight, self.scored
        return {
            "status": "ok",
            "kind": cfg.kind,
            "function": cfg.function,
            "mode": cfg.mode,
            "timeout_s": cfg.timeout_s,
            "memory_mb": cfg.memory_mb,
            "workers": self.pool.workers,
            "capacity": self.capacity,
            "in_flight": in_flight,
            "scored": scored,
        }

    def authorize(self, header: str | None) -> int:
        """0 when `header` carries the job's token, else the HTTP status to answer (401 or 403)."""
        if not header or not header.startswith("Bearer "):
            return 401
        return 0 if hmac.compare_digest(header[len("Bearer ") :].strip().encode(), self.token) else 403

    def admit(self) -> bool:
        with self._lock:
            if self.in_flight >= self.capacity:
                return False
            self.in_flight += 1
            return True

    def score(self, body: Any) -> dict[str, Any]:
        """Score one admitted request's body (ValueError: a 400); releases its slot."""
        try:
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if not isinstance(body.get("completion"), str):
                raise ValueError("'completion' must be a string")
            problem = problem_from_wire(body.get("problem"))
            result: RewardResult = self.pool.call(problem, body["completion"])
            with self._lock:
                self.scored += 1
            out = result.to_dict()
            out["sample_id"] = body.get("id")
            return out
        finally:
            with self._lock:
                self.in_flight -= 1

    def app(self):
        """The ASGI application (Starlette)."""
        import anyio
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        limiter = anyio.CapacityLimiter(self.capacity)  # a thread per admitted job, never more

        async def health(request):
            return JSONResponse(self.health())

        async def score(request):
            status = self.authorize(request.headers.get("authorization"))
            if status == 401:
                return JSONResponse(
                    {"error": f"no token: send 'Authorization: Bearer <{TOKEN_ENV}>'"},
                    401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            if status == 403:
                return JSONResponse({"error": "wrong token: this server scores another job's samples"}, 403)
            if not self.admit():
                return JSONResponse(
                    {"error": f"queue full ({self.capacity} jobs in flight)"},
                    503,
                    headers={"Retry-After": "1"},
                )
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                with self._lock:
                    self.in_flight -= 1
                return JSONResponse({"error": f"the body is not JSON: {e}"}, 400)
            try:
                out = await anyio.to_thread.run_sync(self.score, body, limiter=limiter)
            except ValueError as e:
                return JSONResponse({"error": str(e)}, 400)
            return JSONResponse(out)

        return Starlette(routes=[Route("/health", health), Route("/score", score, methods=["POST"])])


def serve(pool, token: str, host: str, port: int, capacity: int, port_file: str = "", ready=None) -> int:
    """Serve until SIGINT/SIGTERM; the samples scored. `port` 0 takes a free one; `port_file` receives
    "host:port" once the socket listens (written whole, then renamed: a reader never sees half of it);
    `ready(address)` is called then too."""
    import uvicorn

    service = ScoreService(pool, token, capacity)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    address = f"{advertised_host(host)}:{sock.getsockname()[1]}"
    if port_file:
        tmp = Path(f"{port_file}.{os.getpid()}.tmp")
        tmp.write_text(address + "\n")
        tmp.replace(port_file)
    if ready is not None:
        ready(address)
    config = uvicorn.Config(service.app(), log_level="warning", access_log=False, timeout_keep_alive=30)
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again to the handler it found:
    # a no-op here, so a stop (Ctrl-C, or slurm/train.sbatch at the job's end) returns and the caller
    # closes the sandboxes, instead of a KeyboardInterrupt traceback or a death by SIGTERM.
    before = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return service.scored


def advertised_host(host: str) -> str:
    """The name clients should use: the machine's hostname when bound to every interface."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


def launch_here(args: list[str], env: dict, log_path: Path, timeout_s: float = 90.0):
    """Start `megatron-rl reward-server ARGS --host 127.0.0.1 --port 0` on this machine, its output in
    `log_path`, and wait until it listens; (process, "host:port"). For benchmarks and tests: a fleet
    on one machine's loopback."""
    import subprocess
    import sys
    import time

    port_file = log_path.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "megatron_rl.cli", "reward-server", "--host", "127.0.0.1", "--port", "0"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*cmd, "--port-file", str(port_file), *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + timeout_s
    while not port_file.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"reward-server did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    return proc, port_file.read_text().strip()
