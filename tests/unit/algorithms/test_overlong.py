"""Over-long masking and the soft length penalty by hand."""

import pytest
import torch

from megatron_rl.algorithms import overlong_mask, overlong_penalty


def test_mask_drops_truncated_rows_only():
    mask_BT = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    truncated_B = torch.tensor([True, False, False])
    expected = torch.tensor([[0, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(overlong_mask(mask_BT, truncated_B), expected)
    # Float masks keep their dtype.
    assert overlong_mask(mask_BT.float(), truncated_B).dtype == torch.float32


def test_penalty_by_hand():
    # max_len 100, buffer 20: free up to 80, then (80 - L) / 20, -1 from 100 on.
    #   50 -> 0;  80 -> 0;  85 -> -5/20 = -0.25;  90 -> -0.5;  100 -> -1;  120 -> -1.
    lengths_B = torch.tensor([50, 80, 85, 90, 100, 120])
    torch.testing.assert_close(
        overlong_penalty(lengths_B, max_len=100, buffer=20), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    )


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="one flag per sequence"):
        overlong_mask(torch.ones(2, 3), torch.tensor([True]))
    with pytest.raises(ValueError, match="buffer must be in"):
        overlong_penalty(torch.tensor([1]), max_len=10, buffer=0)
    with pytest.raises(ValueError, match="buffer must be in"):
        overlong_penalty(torch.tensor([1]), max_len=10, buffer=11)
