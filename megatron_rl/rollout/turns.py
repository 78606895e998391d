"""Multi-turn rollouts: turns of many trajectories interleaved on one engine, environments in threads.

A trajectory is one sample: the prompt, then turn 1 as the engine produced it, the environment's
observation (env/render.py: the chat template's tokens for one more message), turn 2, and so on.
Token in, token out: every turn is submitted as the exact token ids so far and its output appended
as the engine returned it, so nothing is ever decoded and encoded again; the sample's `loss_mask`
is 1 on the tokens the model generated and 0 on observations, which are context only.

Scheduling: every trajectory's first turn enters the engine at once. When a turn finishes, its
episode's `step` runs on a worker thread (a sandbox run of a second or more), while the engine keeps
stepping the other trajectories; an observation that comes back is appended and the next turn queued
at the engine's next step. A sample waiting on its sandbox holds no one else up.

Ends: the environment says done; `rollout.max_turns` turns were taken (the last turn's step grades
it); or the trajectory reached its cap, recorded as truncated (finish reason "length"): the
trajectory's `rollout.max_new_tokens` (turns and observations together) or the engine's context. A
turn that runs into `rollout.turn_max_tokens` ends that turn only (`Turn.truncated`): the
environment answers it like any other. One reward per trajectory: that of the
step that ends it. An environment that raises ends its trajectory with reward 0 and status env_error,
the error kept on the sample (env/types.py `step_safely`), and so does one that does not answer within
`rollout.env_timeout_s`; the run goes on.

Every turn records the engine's own view (`Sample.engine_spans`: the context vLLM reports it ran,
plus the turn's output, as a digest), which the trainer checks against the ids it trains on
(`token_exact`).

One engine rank per engine (rollout TP 1): environments run on the engine leader, and ranks of a TP
engine would need every observation in lockstep; the recipe check refuses TP > 1 with an
environment (check/rules.py).
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from megatron_rl.env.types import ENV_ERROR, Episode, StepResult, Turn, start_safely, step_safely
from megatron_rl.reward.result import FAILED, PASSED
from megatron_rl.rollout.stream import append_delta, finish_reason
from megatron_rl.rollout.types import Partial, Sample, token_digest


@dataclass(frozen=True)
class TurnSettings:
    max_turns: int
    turn_max_tokens: int  # 0: a turn may use what is left of the trajectory's cap
    observation_max_tokens: int
    step_timeout_s: float = 600.0  # an environment step that takes longer ends its trajectory (env_error)


@dataclass
class _Trajectory:
    request: Partial  # prompt_index is the engine's local prompt index; max_tokens the trajectory's cap
    episode: Episode | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    spans: list[tuple[int, str]] = field(default_factory=list)
    turns: int = 0
    env_s: float = 0.0
    last_turn: list[int] = field(default_factory=list)
    at_cap: bool = False  # the turn running now may take every token the trajectory has left

    @property
    def key(self) -> tuple[int, int]:
        return self.request.prompt_index, self.request.sample_index


class TurnScheduler:
    """The engine leader's scorer for multi-turn runs: it drives the turns, runs the environment (which
    grades with the reward pool it wraps) and yields each trajectory scored. `close` ends both."""

    multi_turn = True

    def __init__(self, pool, env, task, renderer, settings: TurnSettings, workers: int):
        self.pool, self.env, self.task, self.renderer, self.settings = pool, env, task, renderer, settings
        self._threads = ThreadPoolExecutor(max(1, workers), thread_name_prefix="env")

    def close(self) -> None:
        # Not waiting: a hung environment's thread must not hang the run's end (the pool's close then
        # waits for the sandbox jobs already queued, which have their own limits).
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self.pool is not None:
            self.pool.close()

    def stream(self, engine, requests: list[Partial], prompts: list, call_id: int) -> TurnStream:
        return TurnStream(self, engine, requests, prompts, call_id)


class TurnStream:
    """The scored trajectories of one call, as they end; `close()` aborts the rest (rollout.oversample).
    `cut` stays empty: partial rollouts are refused with an environment (check/rules.py)."""

    def __init__(self, sched: TurnScheduler, engine, requests: list[Partial], prompts: list, call_id: int):
        self.s, self.engine, self.call, self.cut = sched, engine, call_id, []
        self.env_wait_s = 0.0  # the engine idle: no turn to generate, every trajectory with its environment
        self._gen = self._run(requests, prompts)

    def __iter__(self) -> TurnStream:
        return self

    def __next__(self) -> Sample:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()

    # ---- the loop ---------------------------------------------------------------------------
    def _run(self, requests: list[Partial], prompts: list):
        from megatron_rl.rollout.vllm_engine import request_seed

        s, engine = self.s, self.engine
        live: dict[str, _Trajectory] = {}  # request id -> trajectory, while the engine generates its turn
        env_calls: dict[Future, _Trajectory] = {}
        ended: list[Sample] = []
        engine.open_turns()
        started = time.perf_counter()
        limit = s.settings.step_timeout_s
        began: dict[Future, float] = {}

        def room_of(t: _Trajectory, extra: int = 0) -> int:
            held = len(t.tokens) + extra
            return min(t.request.max_tokens - held, engine.max_model_len - len(t.request.prompt_ids) - held)

        def queue_turn(t: _Trajectory) -> None:
            room = room_of(t)
            cap = min(room, s.settings.turn_max_tokens) if s.settings.turn_max_tokens > 0 else room
            t.at_cap = cap == room
            if cap < 1:
                ended.append(self._finish(t, StepResult(done=True), truncated=True))
                return
            pi, si = t.key
            rid = f"c{self.call}-p{pi}-s{si}-t{t.turns}"
            key = (engine.seed, engine.engine_index, self.call, pi, si)
            seed = request_seed(*key, t.turns) if t.turns else request_seed(*key)
            engine.add_turn(rid, t.request.prompt_ids + t.tokens, cap, seed)
            live[rid] = t

        try:
            for r in requests:
                prompt = prompts[r.prompt_index]
                episode = start_safely(s.env, prompt, s.task.problem(prompt))
                t = _Trajectory(r, episode if not isinstance(episode, StepResult) else None)
                if isinstance(episode, StepResult):
                    ended.append(self._finish(t, episode, truncated=False))
                else:
                    queue_turn(t)
            while live or env_calls or ended:
                while ended:
                    yield ended.pop(0)
                if not (live or env_calls):
                    break
                if live and engine.busy():
                    for out in engine.step_turns():
                        t = live.pop(out.request_id, None)
                        if t is not None:
                            future = self._take_turn(t, out, engine.version)
                            env_calls[future], began[future] = t, time.perf_counter()
                elif live:
                    raise RuntimeError(f"the engine dropped {len(live)} turns without finishing them")
                # Environments that answered: appended now; when only environments run, wait for one (and
                # no longer than the step limit: an environment that hangs ends its trajectory, not the run).
                done = [f for f in env_calls if f.done()]
                if not done and env_calls and not live:
                    t_wait = time.perf_counter()
                    oldest = min(began[f] for f in env_calls)
                    left = max(0.0, oldest + limit - t_wait)
                    done = list(wait(list(env_calls), timeout=left, return_when=FIRST_COMPLETED)[0])
                    self.env_wait_s += time.perf_counter() - t_wait
                now = time.perf_counter()
                for f in [f for f in env_calls if not f.done() and now - began[f] > limit]:
                    t = env_calls.pop(f)
                    began.pop(f, None)
                    f.cancel()  # a thread cannot be stopped: it finishes on its own, its answer unread
                    hung = StepResult(done=True, status=ENV_ERROR)
                    hung.info = {"error": f"the environment did not answer a turn within {limit:g} s"}
                    ended.append(self._finish(t, hung, truncated=False))
                for f in done:
                    t = env_calls.pop(f)
                    began.pop(f, None)
                    result, truncated = f.result()
                    t.env_s += result.seconds
                    if result.done or truncated or t.turns >= s.settings.max_turns:
                        ended.append(self._finish(t, result, truncated))
                        continue
                    obs = s.renderer.render(
                        result.observation, result.role, t.last_turn, s.settings.observation_max_tokens
                    )
                    if room_of(t, len(obs)) < 1:  # no token of a next turn would fit: ends at its cap
                        ended.append(self._finish(t, result, truncated=True))
                        continue
                    t.tokens += obs
                    t.logprobs += [0.0] * len(obs)
                    t.mask += [0] * len(obs)
                    t.versions += [t.versions[-1] if t.versions else engine.version] * len(obs)
                    queue_turn(t)
        finally:
            for f in env_calls:
                f.cancel()
            engine.close_turns(list(live))
            engine.last_stream = {"seconds": time.perf_counter() - started}

    def _take_turn(self, t: _Trajectory, out, version: int) -> Future:
        """A finished turn: appended as the engine returned it, then handed to the environment."""
        reason = finish_reason(out)
        ids: list[int] = []
        append_delta(out, ids, t.logprobs)  # the whole turn (FINAL_ONLY): its ids and their log-probs
        t.tokens += ids
        t.mask += [1] * len(ids)
        t.versions += [version] * len(ids)
        t.spans.append((len(t.tokens), token_digest(list(out.prompt_token_ids) + ids)))
        t.turns += 1
        t.last_turn = ids
        # A turn cut at rollout.turn_max_tokens ends the turn; one cut where the trajectory's cap or the
        # context ends leaves no room for another: the trajectory ends there, truncated.
        cut = reason == "length"
        truncated = cut and t.at_cap
        turn = Turn(
            index=t.turns - 1,
            ids=tuple(ids),
            text=self.s.task.turn_text(ids),
            last=t.turns >= self.s.settings.max_turns or truncated,
            truncated=cut,
        )
        return self.s._threads.submit(lambda: (step_safely(t.episode, turn), truncated))

    def _finish(self, t: _Trajectory, result: StepResult, truncated: bool) -> Sample:
        r = t.request
        status = result.status or (PASSED if result.reward >= 1.0 else FAILED)
        first = t.versions[0] if t.versions else self.engine.version
        return Sample(
            prompt_index=r.prompt_index,
            sample_index=r.sample_index,
            prompt_ids=list(r.prompt_ids),
            token_ids=t.tokens,
            logprobs=t.logprobs,
            finish_reason="length" if truncated else "stop",
            truncated=truncated,
            version=first,
            reward=float(result.reward) if status != ENV_ERROR else 0.0,
            status=status,
            token_versions=t.versions if any(v != first for v in t.versions) else None,
            loss_mask=t.mask,
            turns=t.turns,
            env_seconds=t.env_s,
            engine_spans=t.spans,
            error=str(result.info.get("error", "")) if result.info else "",
        )
