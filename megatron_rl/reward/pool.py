"""The reward pool: submit completions as generation finishes them, collect results as they finish.

Generation streams samples out one by one, and the longest completion decides when a batch is done;
scoring each sample the moment it finishes hides almost all of the scoring time behind generation.
So the pool is a queue in front of worker threads, one per CPU of the budget, each owning one warm
sandbox (`sandbox.Sandbox`) or, for `kind=function`, calling an in-process verifier. `submit` is
thread-safe and never blocks; `results()` yields records in completion order, not submission order
(use `sample_id` to match them up; `score()` is the ordered, blocking convenience).

    pool = RewardPool(cfg.reward)                     # once; sandboxes stay warm across steps
    # generation's callback, called (from any thread) as each sample finishes:
    def on_finished(sample):
        pool.submit(sample.id, problem_of[sample.id], sample.text)
    # the training loop, meanwhile:
    for result in pool.results(n_samples, timeout=600):  # as they complete, in any order
        rewards[result.sample_id] = result.reward
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from megatron_rl.config.choices import REWARD_KINDS
from megatron_rl.reward.extract import compose_program
from megatron_rl.reward.remote import FleetRefused
from megatron_rl.reward.result import (
    CRASHED,
    FAILED,
    MODEL_SCORED,
    NO_CODE,
    PASSED,
    REWARD_MODES,
    SANDBOX_ERROR,
    STATUSES,
    RewardResult,
    reward_from_counts,
)
from megatron_rl.reward.sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    default_workers,
    require_sandbox,
)
from megatron_rl.reward.verifiers import load_verifier

if TYPE_CHECKING:
    from megatron_rl.config.schema import RewardConfig
    from megatron_rl.reward.problem import Problem

log = logging.getLogger(__name__)
_STOP = object()


def unverified(problem: Problem, text: str) -> RewardResult:
    """reward.kind=model's verifier: none. The reward model's score, added on the trainer, is the reward."""
    return RewardResult(None, 0.0, MODEL_SCORED, output_tail="scored by the reward model only")


class RewardPool:
    """Scores (problem, completion) pairs on `workers` threads; see the module docstring."""

    def __init__(self, cfg: RewardConfig, *, limits: SandboxLimits | None = None) -> None:
        if cfg.kind not in REWARD_KINDS:
            raise ValueError(f"reward.kind must be one of {', '.join(REWARD_KINDS)}; got {cfg.kind!r}")
        if cfg.mode not in REWARD_MODES:
            raise ValueError(f"reward.mode must be one of {REWARD_MODES}; got {cfg.mode!r}")
        if not all(math.isfinite(v) and v > 0 for v in (cfg.timeout_s, cfg.memory_mb)):
            raise ValueError(
                "reward.timeout_s and reward.memory_mb must be finite numbers > 0; "
                f"got {cfg.timeout_s}, {cfg.memory_mb}"
            )
        self.cfg = cfg
        self._fleet = None
        self._fatal: BaseException | None = None
        if cfg.endpoints or cfg.endpoints_file:  # the reward fleet scores; no sandbox here (remote.py)
            if cfg.kind not in ("sandbox", "function"):
                raise ValueError(f"reward.endpoints serve kind=sandbox or function, not kind={cfg.kind}")
            from megatron_rl.reward.remote import Fleet

            self._fleet = Fleet(cfg)
        self.workers = cfg.workers if cfg.workers > 0 else default_workers()
        if self._fleet is not None:
            self.workers = self._fleet.slots  # a thread per job the servers take at once
        elif self.workers > default_workers():
            log.warning(
                "reward.workers=%d exceeds the %d CPUs this process may use: sandboxes will compete for "
                "cores and wall-clock timeouts will fire on programs that are merely starved",
                self.workers,
                default_workers(),
            )
        self._verifier = None
        sandboxes: list[Sandbox | None] = [None] * self.workers
        if self._fleet is not None:
            pass
        elif cfg.kind == "http":
            from megatron_rl.reward.remote import HttpJudge

            self._verifier = HttpJudge(cfg)
        elif cfg.kind == "function":
            self._verifier = load_verifier(cfg.function)
        elif cfg.kind == "model":  # no verifier: the reward model scores every sample on the trainer
            self._verifier = unverified
        else:
            self.limits = limits or SandboxLimits(timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb)
            bwrap = require_sandbox(cfg.unsafe_local)
            sandboxes = [Sandbox(self.limits, bwrap=bwrap) for _ in range(self.workers)]
        self._sandboxes = sandboxes
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._submitted = 0
        self._delivered = 0
        self._closed = False
        # perf_counter when the newest streamed result was finished: a step that collects its rewards
        # late (loop/step/collect.py PendingRewards) still learns when scoring actually ended
        self.last_result_at = 0.0
        started: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, args=(sb, started), name=f"reward-worker-{i}", daemon=True)
            for i, sb in enumerate(sandboxes)
        ]
        for t in self._threads:
            t.start()
        # Each worker starts its own sandbox (bubblewrap dies with the thread that launched it), all
        # in parallel; a broken setup fails here, loudly, not as a stream of sandbox_error rewards.
        errors = [e for e in (started.get() for _ in self._threads) if e is not None]
        if errors:
            self.close()
            raise errors[0]

    # ---- the streaming API --------------------------------------------------------------------

    def submit(self, sample_id: Any, problem: Problem, completion_text: str) -> None:
        """Queue one completion for scoring. Thread-safe; returns at once."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool.submit after close()")
            self._submitted += 1
        self._jobs.put((sample_id, problem, completion_text, None))

    def call(self, problem: Problem, completion_text: str, timeout: float | None = None) -> RewardResult:
        """Score one completion and wait for its result, beside the stream: the result goes to this
        caller only, never to results() or poll(). Thread-safe (environments call it from their worker
        threads while the loop streams samples: env/). Queued behind the jobs already submitted."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool.call after close()")
        self._jobs.put((None, problem, completion_text, fut))
        result = fut.result(timeout)
        if self._fatal is not None:
            raise RuntimeError(str(self._fatal)) from self._fatal
        return result

    def take_retries(self) -> int:
        """Reward-fleet sends beyond each sample's first since the last call (0 scoring locally)."""
        return self._fleet.take_retries() if self._fleet is not None else 0

    def run_program(self, code: str, timeout_s: float | None = None) -> RewardResult:
        """Run a Python program in the sandbox for what it prints (a tool call: env/tool_calls.py),
        with the sandbox's limits; `output_tail` holds its output and any error, `status` how it ended
        (passed: it ran to its end)."""
        from megatron_rl.reward.problem import Problem

        job = Problem(id="program", prompt="program", tests="assert True\n", timeout_s=timeout_s)
        return self.call(job, code)

    @property
    def pending(self) -> int:
        """Submitted results not yet handed out by results() or poll()."""
        with self._lock:
            return self._submitted - self._delivered

    def results(self, count: int | None = None, timeout: float | None = None) -> Iterator[RewardResult]:
        """Yield results in completion order.

        With `count`, exactly that many, waiting for samples not submitted yet (the training loop knows
        how many samples a step has while generation is still streaming them). Without, until every
        sample submitted so far has been yielded. Raises TimeoutError when `timeout` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        yielded = 0
        while (yielded < count) if count is not None else (self.pending > 0):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(
                    f"reward results still pending after {timeout} s ({self.pending} submitted, unfinished)"
                )
            try:
                result = self._done.get(timeout=remaining)
            except queue.Empty:
                continue
            if self._fatal is not None:
                raise RuntimeError(str(self._fatal)) from self._fatal
            with self._lock:
                self._delivered += 1
            yielded += 1
            yield result

    def poll(self) -> list[RewardResult]:
        """Every result finished so far, without waiting."""
        out = []
        while True:
            try:
                result = self._done.get_nowait()
            except queue.Empty:
                return out
            with self._lock:
                self._delivered += 1
            out.append(result)

    def score(
        self, problems: Sequence[Problem], completions: Sequence[str], timeout: float | None = None
    ) -> list[RewardResult]:
        """Score a batch and return results in input order (sample ids are the indices)."""
        if len(problems) != len(completions):
            raise ValueError(f"got {len(problems)} problems but {len(completions)} completions")
        if self.pending:
            raise RuntimeError("score() needs an idle pool; collect pending streamed results first")
        for i, (problem, text) in enumerate(zip(problems, completions)):
            self.submit(i, problem, text)
        return sorted(self.results(len(problems), timeout), key=lambda r: r.sample_id)

    # ---- workers ------------------------------------------------------------------------------

    def _work(self, sandbox: Sandbox | None, started: queue.SimpleQueue) -> None:
        try:
            if sandbox is not None:
                sandbox.start()
        except Exception as e:  # handed to __init__, which raises it
            started.put(e)
            return
        started.put(None)
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            sample_id, problem, text, fut = item
            try:
                if self._fleet is not None:
                    result = self._fleet.score(sample_id, problem, text)
                elif self._verifier is not None:
                    result = self._score_function(sample_id, problem, text)
                else:
                    assert sandbox is not None
                    result = self._score_sandboxed(sandbox, sample_id, problem, text)
            except SandboxUnavailable as e:
                log.error("reward sandbox failed to restart: %s", e)
                result = RewardResult(sample_id, 0.0, SANDBOX_ERROR, output_tail=str(e)[-2000:])
            except FleetRefused as e:  # a configuration error: results() and call() raise it
                self._fatal = e
                result = RewardResult(sample_id, 0.0, SANDBOX_ERROR, output_tail=str(e)[-2000:])
            except Exception:  # a bug of ours must cost one sample, not the worker
                log.exception("reward worker failed on sample %r", sample_id)
                result = RewardResult(
                    sample_id, 0.0, SANDBOX_ERROR, output_tail=traceback.format_exc()[-2000:]
                )
            if fut is not None:  # call(): the result goes to its caller only
                fut.set_result(result)
            else:
                self.last_result_at = time.perf_counter()
                self._done.put(result)

    def _score_sandboxed(self, sandbox: Sandbox, sample_id: Any, problem: Problem, text: str) -> RewardResult:
        if not problem.tests.strip() and not problem.io_tests:
            return RewardResult(
                sample_id, 0.0, SANDBOX_ERROR, output_tail=f"problem {problem.id!r} has no tests"
            )
        code = compose_program(text, problem.prefix, problem.entry_point)
        if code is None:
            return RewardResult(sample_id, 0.0, NO_CODE, output_tail="no Python code found in the completion")
        timeout = problem.timeout_s or self.cfg.timeout_s
        rec = sandbox.run(
            code,
            problem.tests,
            problem.entry_point,
            timeout,
            io_tests=problem.io_tests,
            prefix=problem.prefix,
            interface=problem.interface,
        )
        status = rec.get("status") if rec.get("status") in STATUSES else SANDBOX_ERROR
        passed, total = int(rec.get("passed", 0)), int(rec.get("total", 0))
        return RewardResult(
            sample_id=sample_id,
            reward=reward_from_counts(status, passed, total, self.cfg.mode),
            status=status,
            seconds=float(rec.get("seconds", 0.0)),
            output_tail=str(rec.get("output_tail", "")),
            tests_passed=passed,
            tests_total=total,
        )

    def _score_function(self, sample_id: Any, problem: Problem, text: str) -> RewardResult:
        start = time.monotonic()
        try:
            value = self._verifier(problem, text)
        except Exception:
            tail = traceback.format_exc()[-2000:]
            return RewardResult(sample_id, 0.0, CRASHED, time.monotonic() - start, tail)
        seconds = time.monotonic() - start
        if isinstance(value, RewardResult):
            value.sample_id, value.seconds = sample_id, value.seconds or seconds
            return value
        if isinstance(value, (bool, int, float)) and value == value:  # not NaN
            reward = float(value)
            return RewardResult(
                sample_id, reward, PASSED if reward >= 1.0 else FAILED, seconds, "", int(reward >= 1.0), 1
            )
        return RewardResult(
            sample_id,
            0.0,
            CRASHED,
            seconds,
            f"{self.cfg.function} returned {value!r}; expected a float, bool or RewardResult",
        )

    # ---- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Finish the queued work, stop the workers and their sandboxes. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)
        for t in self._threads:
            t.join()
        for sb in self._sandboxes:
            if sb is not None:
                sb.close()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
