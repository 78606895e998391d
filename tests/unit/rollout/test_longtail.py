"""Length cap bookkeeping and the over-long options, on samples built by hand."""

import pytest
import torch

from megatron_rl.rollout.longtail import apply_overlong, length_stats, lengths_and_truncation
from megatron_rl.rollout.types import Sample


def _samples():
    # lengths 2, 4, 4 (cap 4): the second was cut at the cap, the third ended with a stop token there.
    return [
        Sample(0, 0, [1], [5, 6], [-1.0] * 2, "stop", False, 0),
        Sample(0, 1, [1], [5, 6, 7, 8], [-1.0] * 4, "length", True, 0),
        Sample(1, 0, [2], [5, 6, 7, 9], [-1.0] * 4, "stop", False, 0),
    ]


def test_lengths_and_flags():
    lengths_B, truncated_B = lengths_and_truncation(_samples())
    assert lengths_B.tolist() == [2, 4, 4] and truncated_B.tolist() == [False, True, False]


def test_modes():
    rewards_B, mask_BT = torch.tensor([1.0, 1.0, 0.0]), torch.ones(3, 4)
    r, m = apply_overlong(_samples(), rewards_B, mask_BT, "none", 4)
    assert torch.equal(r, rewards_B) and torch.equal(m, mask_BT)
    r, m = apply_overlong(_samples(), rewards_B, mask_BT, "mask", 4)
    assert torch.equal(r, rewards_B) and m.sum(1).tolist() == [4.0, 0.0, 4.0]
    # penalty: cap 4, ramp over the last 2 tokens: length 2 -> 0, length 4 -> -1.
    r, m = apply_overlong(_samples(), rewards_B, mask_BT, "penalty", 4, penalty_tokens=2)
    assert r.tolist() == [1.0, 0.0, -1.0] and torch.equal(m, mask_BT)
    with pytest.raises(ValueError, match="overlong_penalty_tokens"):
        apply_overlong(_samples(), rewards_B, mask_BT, "penalty", 4)
    with pytest.raises(ValueError, match="algorithm.overlong"):
        apply_overlong(_samples(), rewards_B, mask_BT, "drop", 4)


def test_stats():
    st = length_stats(_samples())
    assert st["length_max"] == 4 and st["truncated_fraction"] == pytest.approx(1 / 3)
    assert st["length_mean"] == pytest.approx(10 / 3)
