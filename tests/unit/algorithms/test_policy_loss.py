"""Clipped surrogate and truncated importance weights, checked by hand, gradients included.

With old_logprobs = 0 and logprobs = log r, the ratio is r, so each token below is one row of the
PPO case table. d loss / d logprob = -r * A on the unclipped branch (d r / d logp = r), 0 on the
clipped one.
"""

import math

import pytest
import torch

from megatron_rl.algorithms import clipped_surrogate, truncated_is_weights


def _surrogate(ratios, advantages, *, clip_low, clip_high, mask=None, is_weights=None):
    logprobs_BT = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old_BT = torch.zeros_like(logprobs_BT)
    adv_BT = torch.tensor([advantages], dtype=torch.float64)
    mask_BT = torch.ones_like(logprobs_BT, dtype=torch.bool) if mask is None else torch.tensor([mask])
    loss_BT, metrics = clipped_surrogate(
        logprobs_BT, old_BT, adv_BT, mask_BT, clip_low=clip_low, clip_high=clip_high, is_weights_BT=is_weights
    )
    loss_BT.sum().backward()
    return loss_BT.detach()[0], logprobs_BT.grad[0], metrics


def test_case_table_values_and_gradients():
    # clip_low 0.2 -> lower bound 0.8; clip_high 0.28 -> upper bound 1.28.
    #   r=0.5, A=+1: min(0.5, 0.8)   = 0.5   -> loss -0.5,  grad -r*A = -0.5  (flows: undo a bad step)
    #   r=1.1, A=+1: min(1.1, 1.1)   = 1.1   -> loss -1.1,  grad -1.1
    #   r=1.5, A=+1: min(1.5, 1.28)  = 1.28  -> loss -1.28, grad 0            (clipped high)
    #   r=0.5, A=-1: min(-0.5, -0.8) = -0.8  -> loss 0.8,   grad 0            (clipped low)
    #   r=1.5, A=-1: min(-1.5,-1.28) = -1.5  -> loss 1.5,   grad -r*A = 1.5   (flows)
    loss, grad, metrics = _surrogate(
        [0.5, 1.1, 1.5, 0.5, 1.5], [1.0, 1.0, 1.0, -1.0, -1.0], clip_low=0.2, clip_high=0.28
    )
    torch.testing.assert_close(loss, torch.tensor([-0.5, -1.1, -1.28, 0.8, 1.5], dtype=torch.float64))
    torch.testing.assert_close(grad, torch.tensor([-0.5, -1.1, 0.0, 0.0, 1.5], dtype=torch.float64))
    # 2 of 5 tokens clipped: one high, one low. ratio mean = (0.5+1.1+1.5+0.5+1.5)/5 = 1.02.
    assert metrics["clip_fraction"].item() == pytest.approx(2 / 5)
    assert metrics["clip_high_fraction"].item() == pytest.approx(1 / 5)
    assert metrics["clip_low_fraction"].item() == pytest.approx(1 / 5)
    assert metrics["ratio_mean"].item() == pytest.approx(1.02)
    assert metrics["ratio_max"].item() == pytest.approx(1.5)


def test_clip_higher_is_asymmetric():
    # r = 1.25, A = +1: inside 1 + 0.28 -> unclipped (loss -1.25, grad -1.25);
    #                   outside 1 + 0.2 -> clipped at 1.2 (loss -1.2, grad 0).
    loss, grad, _ = _surrogate([1.25], [1.0], clip_low=0.2, clip_high=0.28)
    assert (loss.item(), grad.item()) == (pytest.approx(-1.25), pytest.approx(-1.25))
    loss, grad, _ = _surrogate([1.25], [1.0], clip_low=0.2, clip_high=0.2)
    assert (loss.item(), grad.item()) == (pytest.approx(-1.2), 0.0)
    # The low side is unaffected by clip_high: r = 0.75, A = -1 is below 0.8 -> clipped (loss 0.8).
    loss, grad, _ = _surrogate([0.75], [-1.0], clip_low=0.2, clip_high=0.28)
    assert (loss.item(), grad.item()) == (pytest.approx(0.8), 0.0)
    # ... and with a wider low clip (0.3 -> bound 0.7) it flows: loss -0.75*-1 = 0.75, grad 0.75.
    loss, grad, _ = _surrogate([0.75], [-1.0], clip_low=0.3, clip_high=0.28)
    assert (loss.item(), grad.item()) == (pytest.approx(0.75), pytest.approx(0.75))


def test_per_sequence_advantages_broadcast_over_tokens():
    # Two sequences of two tokens, ratio 1 everywhere; A = [2, -3] per sequence -> loss -A per token.
    logprobs_BT = torch.zeros(2, 2)
    loss_BT, _ = clipped_surrogate(
        logprobs_BT, logprobs_BT, torch.tensor([2.0, -3.0]), torch.ones(2, 2), clip_low=0.2, clip_high=0.2
    )
    torch.testing.assert_close(loss_BT, torch.tensor([[-2.0, -2.0], [3.0, 3.0]]))


def test_masked_tokens_contribute_nothing():
    # The masked token has ratio 100 (would be clipped and counted); it must vanish from loss and metrics.
    # Valid tokens: r=1, A=1 -> loss -1; r=0.9, A=1 -> loss -0.9. ratio mean (1 + 0.9)/2 = 0.95.
    loss, grad, metrics = _surrogate(
        [1.0, 0.9, 100.0], [1.0, 1.0, 1.0], clip_low=0.2, clip_high=0.2, mask=[True, True, False]
    )
    torch.testing.assert_close(loss, torch.tensor([-1.0, -0.9, 0.0], dtype=torch.float64))
    assert grad[2].item() == 0.0
    assert metrics["clip_fraction"].item() == 0.0
    assert metrics["ratio_mean"].item() == pytest.approx(0.95)
    assert metrics["ratio_max"].item() == pytest.approx(1.0)


def test_fully_masked_batch_gives_zero_loss_and_zero_metrics():
    loss, grad, metrics = _surrogate(
        [1.5, 0.5], [1.0, -1.0], clip_low=0.2, clip_high=0.2, mask=[False, False]
    )
    assert torch.equal(loss, torch.zeros(2, dtype=torch.float64))
    assert torch.equal(grad, torch.zeros(2, dtype=torch.float64))
    assert all(value.item() == 0.0 for value in metrics.values())


def test_truncated_is_weights_by_hand():
    # old - rollout = log 3 -> 3, capped at 2; = log 0.5 -> 0.5 (below the cap, kept).
    old_BT = torch.tensor([[math.log(3.0), math.log(0.5)]], requires_grad=True)
    rollout_BT = torch.zeros(1, 2, requires_grad=True)
    weights_BT = truncated_is_weights(old_BT, rollout_BT, cap=2.0)
    torch.testing.assert_close(weights_BT, torch.tensor([[2.0, 0.5]]))
    assert not weights_BT.requires_grad


def test_is_weights_scale_loss_and_gradient():
    # r=1.1, A=+1 unclipped: loss -1.1 * w, grad -1.1 * w with w = 0.5.
    loss, grad, metrics = _surrogate(
        [1.1], [1.0], clip_low=0.2, clip_high=0.2, is_weights=torch.tensor([[0.5]], dtype=torch.float64)
    )
    assert loss.item() == pytest.approx(-0.55)
    assert grad.item() == pytest.approx(-0.55)
    assert metrics["is_weight_mean"].item() == pytest.approx(0.5)


def test_bad_input_is_named():
    x_BT = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mask_BT has shape"):
        clipped_surrogate(x_BT, x_BT, torch.zeros(2), torch.ones(2, 4), clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="one value per sequence"):
        clipped_surrogate(x_BT, x_BT, torch.zeros(3), torch.ones(2, 3), clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="clip_low"):
        clipped_surrogate(x_BT, x_BT, torch.zeros(2), torch.ones(2, 3), clip_low=1.0, clip_high=0.2)
    with pytest.raises(ValueError, match="only 0 and 1"):
        clipped_surrogate(x_BT, x_BT, torch.zeros(2), torch.full((2, 3), 0.5), clip_low=0.2, clip_high=0.2)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(x_BT, x_BT, cap=0.0)
