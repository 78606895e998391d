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
