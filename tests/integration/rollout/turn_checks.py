"""Multi-turn scheduling on the live engine of worker_engine.py (one engine start serves both).

A test environment (no sandbox: the sandbox environments have their own tests, tests/integration/env)
answers every turn with three fixed ids, takes 2 s to answer trajectory (0, 0)'s first turn, raises on
trajectory (1, 1), and ends a trajectory after its third turn. Recorded: when each environment call
started and ended, and every sample with its mask, spans and the HF oracle's log-probs of its
generated tokens.
"""

from __future__ import annotations

import threading
import time

import torch

from megatron_rl.env.render import PlainRenderer
from megatron_rl.env.types import StepResult
from megatron_rl.rollout.sampling import apply_sampling_convention
from megatron_rl.rollout.turns import TurnScheduler, TurnSettings
from megatron_rl.rollout.types import SamplingSettings, token_exact

OBS = [11, 12, 13]
PROMPTS = [[1, 2, 3, 4], [10, 20, 30], [50, 60, 70, 80, 90]]


class _Task:
    def problem(self, prompt):
        return prompt

    def turn_text(self, ids):
        return " ".join(map(str, ids))


class _Env:
    def __init__(self):
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def start(self, prompt, problem):
        return _Episode(self, tuple(prompt))


class _Episode:
    def __init__(self, env, prompt):
        self.env, self.prompt, self.key = env, prompt, None

    def step(self, turn):
        t0 = time.perf_counter()
        if self.prompt == tuple(PROMPTS[1]) and turn.index == 0 and self.env.raise_next():
            raise RuntimeError("environment crashed on purpose")
        if self.prompt == tuple(PROMPTS[0]) and turn.index == 0 and self.env.slow_next():
            time.sleep(2.0)
        with self.env.lock:
            self.env.calls.append((self.prompt, turn.index, t0, time.perf_counter(), len(turn.ids)))
        return StepResult(" ".join(map(str, OBS)), reward=0.25 * (turn.index + 1), done=turn.index >= 2)


class _Once:
    def __init__(self):
        self.done, self.lock = False, threading.Lock()

    def __call__(self):
        with self.lock:
            first, self.done = not self.done, True
            return first


def turn_checks(eng, hf_model) -> dict:
    env = _Env()
    env.raise_next, env.slow_next = _Once(), _Once()
    renderer = PlainRenderer(lambda text: [int(x) for x in text.split()])
    sched = TurnScheduler(None, env, _Task(), renderer, TurnSettings(4, 5, 8), workers=8)
    s = SamplingSettings(max_new_tokens=40)
    requests = eng.requests_for(PROMPTS, 2, s)
    started = time.perf_counter()
    samples = list(sched.stream(eng, requests, PROMPTS, call_id=11))
    wall = time.perf_counter() - started
    out = {
        "wall_s": wall,
        "samples": [],
        "calls": [(list(p), i, a - started, b - started, n) for p, i, a, b, n in env.calls],
    }
    for x in sorted(samples, key=lambda x: (x.prompt_index, x.sample_index)):
        seq = x.sequence
        with torch.no_grad():
            logits = hf_model(torch.tensor([seq])).logits[0].float()[len(x.prompt_ids) - 1 : len(seq) - 1]
        lp = apply_sampling_convention(
            logits, eng.sampling.temperature, eng.sampling.top_p, eng.sampling.top_k
        )
        ref = lp[torch.arange(len(x.token_ids)), torch.tensor(x.token_ids)]
        gen = torch.tensor(x.loss_mask, dtype=torch.bool)
        obs_at = [i for i, m in enumerate(x.loss_mask) if not m]
        out["samples"].append(
            dict(
                key=[x.prompt_index, x.sample_index],
                turns=x.turns,
                reward=x.reward,
                status=x.status,
                error=x.error,
                truncated=x.truncated,
                finish_reason=x.finish_reason,
                tokens=len(x.token_ids),
                turn_lengths=[
                    b - a
                    for a, b in zip([0] + [e for e, _ in x.engine_spans], [e for e, _ in x.engine_spans])
                ],
                observation_ids=[x.token_ids[i] for i in obs_at],
                exact=token_exact(x, seq),
                exact_if_reencoded=token_exact(x, seq[:-1] + [seq[-1] ^ 1]),
                max_gen_diff=float((ref[gen] - torch.tensor(x.logprobs)[gen]).abs().max())
                if gen.any()
                else 0.0,
                env_seconds=x.env_seconds,
            )
        )
    # A trajectory cap that cannot hold three turns: the trajectory ends truncated at its cap.
    short = eng.requests_for(PROMPTS[:1], 1, SamplingSettings(max_new_tokens=12))
    sched2 = TurnScheduler(None, _Env(), _Task(), renderer, TurnSettings(4, 5, 8), workers=2)
    sched2.env.raise_next = sched2.env.slow_next = lambda: False
    capped = list(sched2.stream(eng, short, PROMPTS, call_id=12))[0]
    out["capped"] = dict(
        tokens=len(capped.token_ids),
        truncated=capped.truncated,
        reason=capped.finish_reason,
        turns=capped.turns,
    )
    # Closed after the first trajectory: the rest is aborted and the engine serves the next call.
    stream = sched2.stream(eng, eng.requests_for(PROMPTS, 2, s), PROMPTS, call_id=13)
    next(stream)
    stream.close()
    out["after_close_busy"] = eng.busy()
    out["after_close_generates"] = len(eng.generate(PROMPTS, 1, SamplingSettings(max_new_tokens=4)))

    # An environment that hangs: its trajectory ends after the step limit (1 s), the other one finishes.
    class Split:
        def __init__(self):
            self.lock, self.n = threading.Lock(), 0

        def start(self, prompt, problem):
            with self.lock:
                self.n += 1
                return _Sleepy(3.0 if self.n == 1 else 0.0)

    sched3 = TurnScheduler(
        None, Split(), _Task(), renderer, TurnSettings(2, 4, 8, step_timeout_s=1.0), workers=2
    )
    t0 = time.perf_counter()
    two = sorted(
        sched3.stream(eng, eng.requests_for(PROMPTS[:1], 2, s), PROMPTS, call_id=14),
        key=lambda x: x.sample_index,
    )
    out["hung"] = dict(
        status=two[0].status,
        error=two[0].error,
        others=[x.status for x in two[1:]],
        seconds=time.perf_counter() - t0,
    )
    sched.close()
    sched2.close()
    sched3.close()
    return out


class _Sleepy:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def step(self, turn):
        time.sleep(self.seconds)
        return StepResult(reward=1.0, done=True, status="passed")
