"""Group-relative advantages, checked against values computed by hand."""

import math

import pytest
import torch

from megatron_rl.algorithms import group_advantages


def test_grpo_std_normalised_by_hand():
    # Group 1: [1, 0, 0, 1]: mean 0.5, deviations [+0.5, -0.5, -0.5, +0.5],
    #   sample std = sqrt(4 * 0.25 / 3) = sqrt(1/3), so advantage = 0.5 / sqrt(1/3) = sqrt(3)/2.
    # Group 2: [2, 2, 2, 2]: all equal -> zeros.
    rewards_G = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    a = math.sqrt(3) / 2
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards_G, 4, eps=0.0), expected)


def test_eps_enters_the_denominator():
    # [1, 2, 3]: mean 2, deviations [-1, 0, 1], sample std = sqrt((1 + 0 + 1) / 2) = 1.
    # eps = 1 -> deviations / (1 + 1) = [-0.5, 0, 0.5].
    rewards_G = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(group_advantages(rewards_G, 3, eps=0.0), torch.tensor([-1.0, 0.0, 1.0]))
    torch.testing.assert_close(group_advantages(rewards_G, 3, eps=1.0), torch.tensor([-0.5, 0.0, 0.5]))


def test_dr_grpo_is_mean_centred_only():
    # [1, 0, 0, 1] - 0.5 = [0.5, -0.5, -0.5, 0.5]; [3, 5] - 4 = [-1, 1] (no std division).
    torch.testing.assert_close(
        group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, std_norm=False),
        torch.tensor([0.5, -0.5, -0.5, 0.5]),
    )
    torch.testing.assert_close(
        group_advantages(torch.tensor([3.0, 5.0]), 2, std_norm=False), torch.tensor([-1.0, 1.0])
    )


@pytest.mark.parametrize("std_norm", [True, False])
def test_all_equal_rewards_give_exact_zeros(std_norm):
    # 0.1 is not representable; the float mean of seven copies need not equal 0.1 exactly, and
    # dividing its rounding error by a zero std + 1e-6 would give a visible non-zero advantage.
    rewards_G = torch.full((7,), 0.1)
    advantages_G = group_advantages(rewards_G, 7, std_norm=std_norm)
    assert torch.equal(advantages_G, torch.zeros(7))


def test_groups_are_independent_and_prompt_major():
    # Two groups of 2: [0, 1] -> [-0.5, 0.5] and [10, 30] -> [-10, 10] without std.
    rewards_G = torch.tensor([0.0, 1.0, 10.0, 30.0])
    torch.testing.assert_close(
        group_advantages(rewards_G, 2, std_norm=False), torch.tensor([-0.5, 0.5, -10.0, 10.0])
    )
    # With std: each group of two symmetric values normalises to -+1/sqrt(2)
    # (deviation d, sample std = sqrt(2 d^2 / 1) = d sqrt 2).
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(group_advantages(rewards_G, 2, eps=0.0), torch.tensor([-s, s, -s, s]))


def test_output_is_detached():
    rewards_G = torch.tensor([0.0, 1.0], requires_grad=True)
    assert not group_advantages(rewards_G, 2).requires_grad


@pytest.mark.parametrize(
    ("rewards_G", "n", "match"),
    [
        (torch.zeros(6), 1, "n must be >= 2"),
        (torch.zeros(5), 2, "not a multiple"),
        (torch.zeros(2, 2), 2, "flat"),
    ],
)
def test_bad_input_is_named(rewards_G, n, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards_G, n)
