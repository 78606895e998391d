"""Deferred scoring (loop/step/collect.py PendingRewards): a batch that returns before its rewards gets
exactly the pool's rewards, by key, once; a sample the pool never scored fails the step instead of
training with the default reward of 0. A real RewardPool with a function verifier (math answers)."""

import time

import pytest

from megatron_rl.config.schema import RewardConfig
from megatron_rl.loop.step.collect import CollectStats, PendingRewards
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.rollout.types import Sample
from megatron_rl.telemetry.phases import PhaseTimer


def slow_math(problem, completion):
    """math_answer after a pause: the results arrive while the caller does something else."""
    from megatron_rl.reward.verifiers import math_answer

    time.sleep(0.05)
    return math_answer(problem, completion)


def _sample(prompt: int, sample: int) -> Sample:
    return Sample(prompt, sample, [1], [2], [0.0], "stop", False, 1)


def _pool() -> RewardPool:
    return RewardPool(RewardConfig(kind="function", function=f"{__name__}:slow_math", workers=2))


def test_rewards_arrive_by_key_after_the_caller_went_on():
    # the pool's keys are (prompt index in its draw, sample index); the batch renumbered its prompts
    keys = [(3, 0), (3, 1), (5, 0), (5, 1)]
    samples = [_sample(i // 2, i % 2) for i in range(4)]
    stats = CollectStats()
    with _pool() as pool:
        stats.ended_at = time.perf_counter()  # generation's end
        for k, (p, s) in enumerate(keys):
            pool.submit(
                (p, s), Problem(id=f"m{k}", prompt="?", answer=str(p)), f"\\boxed{{{p if s else p + 1}}}"
            )
        pending = PendingRewards(samples, keys, pool, list(keys), None, PhaseTimer(), stats)
        assert all(s.status == "" for s in samples)  # not scored yet: nothing reads a reward of 0 as one
        time.sleep(0.5)  # the trainer's reward-free forwards: the pool finishes meanwhile
        waited = time.perf_counter()
        pending.wait()
        waited = time.perf_counter() - waited
        with pytest.raises(RuntimeError, match="twice"):
            pending.wait()
    assert [(s.reward, s.status) for s in samples] == [(0.0, "failed"), (1.0, "passed")] * 2
    assert stats.scoring_busy_s >= 4 * 0.05 and stats.scoring_tail_s > 0
    # the pool's time after generation is when its last result came (two rounds of 0.05 s on 2 workers),
    # not the short wait after the forwards
    assert stats.scoring_tail_s <= waited < 0.1
    assert 0.1 <= stats.scoring_after_s < 0.5


def test_a_sample_the_pool_never_scored_fails_the_step():
    samples = [_sample(0, 0), _sample(0, 1)]
    with _pool() as pool:
        pool.submit((0, 0), Problem(id="m", prompt="?", answer="1"), "\\boxed{1}")
        # the batch holds (0, 1), which no engine leader submitted
        pending = PendingRewards(
            samples, [(0, 0), (0, 1)], pool, [(0, 0)], None, PhaseTimer(), CollectStats()
        )
        with pytest.raises(RuntimeError, match=r"\(0, 1\) of the batch was never scored"):
            pending.wait()


def test_a_sample_scored_already_keeps_its_reward():
    done = _sample(0, 0)
    done.reward, done.status = 0.7, "passed"
    pending = PendingRewards([done], [(9, 9)], None, [], None, PhaseTimer(), CollectStats())
    pending.wait()
    assert (done.reward, done.status) == (0.7, "passed")
