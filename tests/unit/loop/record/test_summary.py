"""How completions ended, per step: lengths and the share that stopped at a stop id."""

from __future__ import annotations

from megatron_rl.loop.record.summary import completion_stats
from megatron_rl.rollout.types import Sample


def _sample(i: int, n: int, reason: str) -> Sample:
    return Sample(i, 0, [1, 2], list(range(n)), [0.0] * n, reason, reason == "length", 0)


def test_completion_stats_count_stops_and_lengths():
    samples = [_sample(0, 3, "stop"), _sample(1, 8, "length"), _sample(2, 5, "stop"), _sample(3, 8, "length")]
    assert completion_stats(samples) == {
        "completion_tokens_mean": 6.0,
        "completion_tokens_max": 8,
        "stop_fraction": 0.5,
    }
    assert completion_stats([_sample(0, 8, "length")])["stop_fraction"] == 0.0


def _scored(prompt: int, sample: int, reward: float, status: str) -> Sample:
    s = Sample(prompt, sample, [1, 4, 5, 16], [4, 7, 2], [0.0] * 3, "stop", False, 3)
    s.reward, s.status = reward, status
    return s


def test_flat_groups_are_those_whose_samples_all_got_one_reward():
    from megatron_rl.loop.record.summary import flat_group_fraction

    batch = [_scored(0, 0, 0.0, "no_code"), _scored(0, 1, 0.0, "no_code")]  # flat: nothing to compare
    batch += [_scored(1, 0, 1.0, "passed"), _scored(1, 1, 0.25, "failed")]  # signal
    batch += [_scored(2, 0, 1.0, "passed"), _scored(2, 1, 1.0, "passed")]  # flat at 1
    assert flat_group_fraction(batch) == 2 / 3
    assert flat_group_fraction(batch[:2] + batch[4:]) == 1.0 and flat_group_fraction([]) == 0.0


def test_kept_samples_are_spread_over_the_groups_and_read_as_text():
    from megatron_rl.data.synthetic import ArithmeticTask
    from megatron_rl.loop.record.summary import kept_samples

    batch = [_scored(p, i, 0.25 * i, "failed") for p in range(4) for i in range(4)]  # prompt-major
    rows = kept_samples(7, batch, ArithmeticTask(), 4)
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert rows[0] == {
        "step": 7,
        "prompt_index": 0,
        "sample_index": 0,
        "reward": 0.0,
        "status": "failed",
        "finish_reason": "stop",
        "completion_tokens": 3,
        "version": 3,
        "prompt": "<bos>12=",
        "completion": "14<eos>",
    }
    assert len(kept_samples(1, batch[:2], ArithmeticTask(), 4)) == 2, "no more than the step has"
    assert kept_samples(1, batch, ArithmeticTask(), 0) == []
