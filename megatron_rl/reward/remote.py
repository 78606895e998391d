"""Scoring elsewhere: the reward fleet (reward servers on CPU nodes) and HTTP judges.

`Fleet` is what the reward pool's workers call instead of their own sandboxes when the recipe names
`reward.endpoints` (or `reward.endpoints_file`): each sample goes to the least-loaded server (jobs in
flight over its capacity, as its /health reported it), with `reward.remote_timeout_s` per request.
A server that fails (no connection, a timeout, a 5xx) is left out for a back-off that doubles while it
keeps failing, and the sample goes to another; a busy one (503) is only passed over. A sample is sent
at most `reward.remote_attempts` times; if no server scored it by then, it is scored `sandbox_error`
(our side failed, not the sample) with every server's answer in its output, never dropped. Whatever
the servers answer, the pool yields one result per sample: a retry that races an answer that was
late is never counted twice (the pool counts results, not answers). A server that refuses the job's
token (401/403) is a configuration error: the pool raises it (`FleetRefused`) instead of training
on sandbox errors.

`HttpJudge` is reward.kind=http's verifier: it posts each (prompt, completion) to the recipe's
`reward.url` and takes {"reward": float} back, with a timeout and retries.

Both use `requests` (one session per worker thread: connections are kept alive between samples).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_rl.reward.result import FAILED, PASSED, SANDBOX_ERROR, STATUSES, RewardResult
from megatron_rl.reward.server import TOKEN_ENV, problem_to_wire

if TYPE_CHECKING:
    from megatron_rl.config.schema import RewardConfig
    from megatron_rl.reward.problem import Problem

log = logging.getLogger(__name__)
_BACKOFF_S, _BACKOFF_MAX_S = 1.0, 30.0


class FleetRefused(RuntimeError):
    """A reward server refused the job's token, or scores with other settings than the recipe's: no
    retry can help."""


class _Server:
    def __init__(self, address: str):
        self.address = address
        self.url = f"http://{address}"
        self.capacity = 1
        self.in_flight = 0
        self.down_until = 0.0
        self.backoff = _BACKOFF_S
        self.last_error = ""
        self.checked = False  # its /health matched the recipe: no job goes to it before


def read_endpoints(cfg: RewardConfig) -> list[str]:
    """reward.endpoints, or the lines of reward.endpoints_file once it exists (waited for up to
    reward.endpoints_wait_s: the fleet may still be starting). ValueError naming what is wrong."""
    if cfg.endpoints and cfg.endpoints_file:
        raise ValueError("reward.endpoints and reward.endpoints_file: give one of them")
    if cfg.endpoints:
        found = list(cfg.endpoints)
    else:
        path, deadline = Path(cfg.endpoints_file), time.monotonic() + cfg.endpoints_wait_s
        while not (path.is_file() and path.read_text().strip()):
            if time.monotonic() > deadline:
                raise ValueError(
                    f"reward.endpoints_file {path}: not written after {cfg.endpoints_wait_s:g} s "
                    "(reward.endpoints_wait_s); is the reward fleet running?"
                )
            time.sleep(0.5)
        found = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    for e in found:
        host, _, port = e.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"reward endpoint {e!r} is not host:port")
    return found


class Fleet:
    """The reward servers of one job, shared by the pool's worker threads."""

    def __init__(self, cfg: RewardConfig, token: str | None = None):
        import requests

        self.cfg = cfg
        self.token = os.environ.get(TOKEN_ENV, "") if token is None else token
        if not self.token:
            raise ValueError(
                f"reward.endpoints need the job's token: set {TOKEN_ENV} (slurm/train.sbatch makes one per "
                "job) to the one the reward servers were started with"
            )
        self.servers = [_Server(a) for a in read_endpoints(cfg)]
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)  # a slot freed or a server back from its back-off
        self._local = threading.local()
        self.retries = 0
        answers = []
        for s in self.servers:
            try:
                h = requests.get(f"{s.url}/health", timeout=10).json()
            except (requests.RequestException, ValueError) as e:
                s.down_until, s.last_error = time.monotonic() + _BACKOFF_S, f"{type(e).__name__}: {e}"
                log.warning(
                    "reward server %s does not answer /health (%s); trying it again later", s.address, e
                )
                continue
            self._check_kind(s.address, h)
            s.capacity, s.checked = max(1, int(h.get("capacity", 1))), True
            answers.append(s)
        if not answers:
            raise ValueError(
                "none of the reward servers answers /health: "
                + "; ".join(f"{s.address}: {s.last_error}" for s in self.servers)
            )
        # threads sending at once: every slot of the servers that answered, and one per server that did not
        self.slots = sum(s.capacity for s in answers) + len(self.servers) - len(answers)

    def _check_kind(self, address: str, h: dict) -> None:
        """A server must score as the recipe would locally: the same verifier, mode and limits."""
        c = self.cfg
        want = {"kind": c.kind, "function": c.function if c.kind == "function" else "", "mode": c.mode}
        want |= {"timeout_s": float(c.timeout_s), "memory_mb": int(c.memory_mb)}
        got = {k: h.get(k) for k in want}
        if got["kind"] != "function":
            got["function"] = ""
        differ = [k for k in want if got[k] != want[k]]
        if differ:
            raise ValueError(
                f"reward server {address} scores with "
                + ", ".join(f"{k}={got[k]!r}" for k in differ)
                + ", the recipe with "
                + ", ".join(f"reward.{k}={want[k]!r}" for k in differ)
                + ": start each reward-server with the recipe's (--function, --mode, --timeout-s, --memory-mb)"
            )

    def take_retries(self) -> int:
        """Sends beyond each sample's first since the last call (the step record's remote_retries)."""
        with self._lock:
            n, self.retries = self.retries, 0
        return n

    def _pick(self, deadline: float) -> _Server | None:
        """The least-loaded server with a free slot, waiting for one (None at `deadline`): a job is never
        sent to a server already holding as many as it takes, nor to one backing off."""
        with self._free:
            while True:
                now = time.monotonic()
                up = [s for s in self.servers if s.down_until <= now and s.in_flight < s.capacity]
                if up:
                    best = min(up, key=lambda s: (s.in_flight / s.capacity, s.in_flight))
                    best.in_flight += 1
                    return best
                if now >= deadline:
                    return None
                waits = [s.down_until - now for s in self.servers if s.down_until > now] + [deadline - now]
                self._free.wait(max(0.01, min(waits)))

    def _release(self, s: _Server, failed: str | None = "") -> None:
        """`failed`: why the server failed (it backs off), "" when it answered, None when it was only busy
        or refused the token (neither counts for or against it)."""
        with self._free:
            s.in_flight -= 1
            if failed:
                s.last_error = failed
                s.down_until = time.monotonic() + s.backoff
                s.backoff = min(2 * s.backoff, _BACKOFF_MAX_S)
            elif failed == "":
                s.backoff = _BACKOFF_S
            self._free.notify()

    def _sent_again(self, attempt: int) -> int:
        """One more send of a sample: counted in `retries` when another will follow."""
        if attempt + 1 < self.cfg.remote_attempts:
            with self._lock:
                self.retries += 1
        return attempt + 1

    def _session(self):
        import requests

        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def score(self, sample_id: Any, problem: Problem, text: str) -> RewardResult:
        """Score one sample on some server; see the module docstring for what happens on failure."""
        import requests

        body = json.dumps({"id": repr(sample_id), "problem": problem_to_wire(problem), "completion": text})
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        errors: list[str] = []
        # busy answers (503: other engine leaders share the fleet) wait and are not sends that failed;
        # all the waiting together ends at the time every allowed send could have taken
        deadline = time.monotonic() + self.cfg.remote_attempts * self.cfg.remote_timeout_s
        attempt, busy_wait = 0, 0.05
        while attempt < self.cfg.remote_attempts:
            server = self._pick(deadline)
            if server is None:
                errors.append("no server free before the deadline")
                break
            if not server.checked:  # down at start: its settings are checked before its first job
                try:
                    h = self._session().get(f"{server.url}/health", timeout=10).json()
                except (requests.RequestException, ValueError) as e:
                    self._release(server, failed=type(e).__name__)
                    errors.append(f"{server.address}: {type(e).__name__}")
                    attempt = self._sent_again(attempt)
                    continue
                try:
                    self._check_kind(server.address, h)
                except ValueError as e:
                    self._release(server, failed=None)
                    raise FleetRefused(str(e)) from None
                server.checked = True
            try:
                r = self._session().post(
                    f"{server.url}/score", data=body, headers=headers, timeout=self.cfg.remote_timeout_s
                )
            except requests.RequestException as e:
                self._release(server, failed=f"{type(e).__name__}")
                errors.append(f"{server.address}: {type(e).__name__}")
                attempt = self._sent_again(attempt)
                continue
            if r.status_code in (401, 403):
                self._release(server, failed=None)
                raise FleetRefused(
                    f"reward server {server.address} refused the job's token ({r.status_code}: "
                    f"{_error(r)}); every server of a job must run with its {TOKEN_ENV}"
                )
            if r.status_code == 503:  # busy: not a failure, only passed over for a moment
                self._release(server, failed=None)
                if time.monotonic() + busy_wait > deadline:
                    errors.append(f"{server.address}: busy until the deadline")
                    break
                time.sleep(busy_wait)
                busy_wait = min(2 * busy_wait, 1.0)
                continue
            if r.status_code == 400:  # the server could not read what we sent: ours, not the sample's
                self._release(server, failed=None)
                return RewardResult(
                    sample_id, 0.0, SANDBOX_ERROR, output_tail=f"{server.address}: {_error(r)}"
                )
            try:
                out = r.json() if r.status_code == 200 else None
                result = _result(sample_id, out)
            except (ValueError, TypeError, KeyError) as e:
                self._release(server, failed=f"HTTP {r.status_code}")
                errors.append(f"{server.address}: HTTP {r.status_code} {e}")
                attempt = self._sent_again(attempt)
                continue
            self._release(server)
            return result
        return RewardResult(
            sample_id,
            0.0,
            SANDBOX_ERROR,
            output_tail=f"no reward server scored it in {self.cfg.remote_attempts} sends: "
            + "; ".join(errors),
        )


def _error(r) -> str:
    try:
        return str(r.json().get("error", r.text[:200]))
    except ValueError:
        return r.text[:200]


def _result(sample_id: Any, out: Any) -> RewardResult:
    """A server's answer as our RewardResult (ValueError when it is not one)."""
    if not isinstance(out, dict) or out.get("status") not in STATUSES:
        raise ValueError(f"not a reward result: {str(out)[:200]}")
    reward = float(out["reward"])
    if not math.isfinite(reward):
        raise ValueError(f"reward {reward} is not finite")
    return RewardResult(
        sample_id,
        reward,
        out["status"],
        float(out.get("seconds", 0.0)),
        str(out.get("output_tail", "")),
        int(out.get("tests_passed", 0)),
        int(out.get("tests_total", 0)),
    )


class HttpJudge:
    """reward.kind=http: a verifier that asks a URL for each sample's reward."""

    def __init__(self, cfg: RewardConfig):
        if not cfg.url.startswith(("http://", "https://")):
            raise ValueError(f"reward.url must be an http(s) URL for reward.kind=http; got {cfg.url!r}")
        self.cfg = cfg
        self.token = os.environ.get(cfg.http_token_env, "") if cfg.http_token_env else ""
        if cfg.http_token_env and not self.token:
            raise ValueError(f"reward.http_token_env names {cfg.http_token_env}, which is not set")
        self._local = threading.local()

    def __call__(self, problem: Problem, text: str) -> RewardResult:
        import requests

        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        body = {
            "prompt": problem.prompt,
            "completion": text,
            "problem_id": problem.id,
            "answer": problem.answer,
        }
        errors = []
        start = time.monotonic()
        for attempt in range(self.cfg.http_retries + 1):
            if attempt:
                time.sleep(min(_BACKOFF_S * 2 ** (attempt - 1), _BACKOFF_MAX_S))
            try:
                r = self._local.session.post(
                    self.cfg.url, json=body, headers=headers, timeout=self.cfg.http_timeout_s
                )
            except requests.RequestException as e:
                errors.append(type(e).__name__)
                continue
            if r.status_code >= 500:
                errors.append(f"HTTP {r.status_code}")
                continue
            seconds = time.monotonic() - start
            try:
                if r.status_code != 200:
                    raise ValueError(f"HTTP {r.status_code}: {r.text[:200]}")
                out = r.json()
                reward = float(out["reward"])
                if not math.isfinite(reward):
                    raise ValueError(f"reward {reward} is not finite")
                status = out.get("status") or (PASSED if reward >= 1.0 else FAILED)
                if status not in STATUSES:
                    raise ValueError(f"status {status!r} is not one of {STATUSES}")
            except (ValueError, TypeError, KeyError) as e:  # the judge answered, but not with a reward
                return RewardResult(None, 0.0, SANDBOX_ERROR, seconds, f"{self.cfg.url}: {e}")
            return RewardResult(None, reward, status, seconds, str(out.get("detail", ""))[:2000])
        return RewardResult(
            None,
            0.0,
            SANDBOX_ERROR,
            time.monotonic() - start,
            f"{self.cfg.url}: no answer in {self.cfg.http_retries + 1} tries: {', '.join(errors)}",
        )
