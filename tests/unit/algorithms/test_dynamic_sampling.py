"""Dynamic sampling decisions by hand."""

import pytest
import torch

from megatron_rl.algorithms import fill_batch, informative_groups, trim_groups


def test_informative_groups():
    # Groups of 3: [1,1,1] all pass, [0,1,0] mixed, [0,0,0] all fail, [0.5,0.5,0.7] mixed partial credit.
    rewards_G = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.7])
    keep_P = informative_groups(rewards_G, 3)
    assert keep_P.tolist() == [False, True, False, True]
    assert keep_P.repeat_interleave(3).tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 3


def test_fill_batch_by_hand():
    rounds = dict(resample_rounds_done=0, max_resample_rounds=3)
    # Nothing drawn yet: a full batch.
    assert fill_batch(0, 8, 0, **rounds) == 8
    # Target met: stop.
    assert fill_batch(8, 8, 10, **rounds) == 0
    # kept 6 of 8: rate (6+1)/(8+2) = 0.7, missing 2 -> ceil(2 / 0.7) = ceil(2.857) = 3.
    assert fill_batch(6, 8, 8, **rounds) == 3
    # kept 3 of 8: rate 4/10 = 0.4, missing 5 -> ceil(12.5) = 13, capped at one batch (8) by default...
    assert fill_batch(3, 8, 8, **rounds) == 8
    # ... or at max_draw.
    assert fill_batch(3, 8, 8, **rounds, max_draw=100) == 13
    # kept 0 of 8: rate 1/10 -> missing 8 / 0.1 = 80, still finite (below max_draw).
    assert fill_batch(0, 8, 8, **rounds, max_draw=1000) == 80
    # Rounds spent: stop even though the batch is short.
    assert fill_batch(3, 8, 8, resample_rounds_done=3, max_resample_rounds=3) == 0


def test_fill_batch_bad_input():
    with pytest.raises(ValueError, match="cannot exceed"):
        fill_batch(5, 8, 4, resample_rounds_done=0, max_resample_rounds=3)
    with pytest.raises(ValueError, match="target_groups must be > 0"):
        fill_batch(0, 0, 4, resample_rounds_done=0, max_resample_rounds=3)


def test_trim_groups_keeps_the_first():
    keep_P = torch.tensor([True, False, True, True, True])
    assert trim_groups(keep_P, 2).tolist() == [True, False, True, False, False]
    assert trim_groups(keep_P, 10).tolist() == keep_P.tolist()
    with pytest.raises(ValueError, match="bool"):
        trim_groups(torch.ones(3), 1)


def test_informative_groups_bad_input():
    with pytest.raises(ValueError, match="not a multiple"):
        informative_groups(torch.zeros(5), 2)
