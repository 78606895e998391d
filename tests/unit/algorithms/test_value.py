"""The clipped value loss by hand, gradients included: which branch binds, what flows where, and the
aggregation (data parallelism included) shared with the policy loss.

d/dv of 0.5 * (v - R)^2 is v - R; on the clipped branch (v moved more than `clip` from the old value)
v_clipped is constant in v, so the gradient is 0.
"""

import math

import pytest
import torch

from megatron_rl.algorithms import LOSS_AGGREGATIONS, clipped_value_loss, loss_normalizer, value_loss

F64 = torch.float64

# clip 0.2. Six valid tokens (row 0 all four, row 1 the first two); padding holds 100.
#   token  old    v     R     v_clipped           (v-R)^2  (vc-R)^2  larger    loss    grad (v - R or 0)
#   a      0.5    0.9   1.0   0.5+0.2 = 0.7        0.01     0.09     clipped   0.045   0
#   b      0.5    0.9   0.0   0.7                  0.81     0.49     unclipped 0.405   0.9
#   c      0.0    0.1   0.5   0.1 (inside)         0.16     0.16     tie       0.08    -0.4
#   d      1.0    0.5   0.9   1.0-0.2 = 0.8        0.16     0.01     unclipped 0.08    -0.4
#   e      0.0   -0.5   0.0   -0.2                 0.25     0.04     unclipped 0.125   -0.5
#   f      0.0   -0.5  -1.0   -0.2                 0.25     0.64     clipped   0.32    0
# Clipped strictly larger on a and f: clip fraction 2/6. value_mean = (0.9+0.9+0.1+0.5-0.5-0.5)/6 = 1.4/6.
# token-mean: (0.045 + 0.405 + 0.08 + 0.08 + 0.125 + 0.32) / 6 = 1.055 / 6 = 0.1758333
# seq-mean-token-mean: row 0 (0.045+0.405+0.08+0.08)/4 = 0.1525, row 1 (0.125+0.32)/2 = 0.2225;
#   mean 0.1875
OLD_BT = torch.tensor([[0.5, 0.5, 0.0, 1.0], [0.0, 0.0, 100.0, 100.0]], dtype=F64)
VALUES_BT = torch.tensor([[0.9, 0.9, 0.1, 0.5], [-0.5, -0.5, 100.0, 100.0]], dtype=F64)
RETURNS_BT = torch.tensor([[1.0, 0.0, 0.5, 0.9], [0.0, -1.0, 100.0, 100.0]], dtype=F64)
MASK_BT = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)


def _values():
    return VALUES_BT.clone().requires_grad_(True)


def test_clipped_loss_by_hand():
    values_BT = _values()
    loss_BT, metrics = clipped_value_loss(values_BT, OLD_BT, RETURNS_BT, MASK_BT, clip=0.2)
    torch.testing.assert_close(
        loss_BT.detach(), torch.tensor([[0.045, 0.405, 0.08, 0.08], [0.125, 0.32, 0.0, 0.0]], dtype=F64)
    )
    loss_BT.sum().backward()
    torch.testing.assert_close(
        values_BT.grad, torch.tensor([[0.0, 0.9, -0.4, -0.4], [-0.5, 0.0, 0.0, 0.0]], dtype=F64)
    )
    assert metrics["value_clip_fraction"].item() == pytest.approx(2 / 6)
    assert metrics["value_mean"].item() == pytest.approx(1.4 / 6)
    assert metrics["tokens"].item() == 6
    assert not any(value.requires_grad for value in metrics.values())


def test_value_loss_aggregates_by_hand():
    values_BT = _values()
    loss, metrics = value_loss(values_BT, OLD_BT, RETURNS_BT, MASK_BT, clip=0.2)
    assert loss.item() == pytest.approx(1.055 / 6)
    assert metrics["value_loss"].item() == pytest.approx(1.055 / 6)
    assert not metrics["value_loss"].requires_grad
    assert metrics["value_clip_fraction"].item() == pytest.approx(1 / 3)
    assert metrics["value_mean"].item() == pytest.approx(1.4 / 6)
    assert metrics["tokens"].item() == 6
    loss.backward()
    # token-mean: each token's gradient / 6.
    torch.testing.assert_close(
        values_BT.grad, torch.tensor([[0.0, 0.9, -0.4, -0.4], [-0.5, 0.0, 0.0, 0.0]], dtype=F64) / 6
    )
    seq_loss, _ = value_loss(_values(), OLD_BT, RETURNS_BT, MASK_BT, clip=0.2, loss_agg="seq-mean-token-mean")
    assert seq_loss.item() == pytest.approx(0.1875)


def test_clip_zero_is_unclipped():
    # 0.5 * (v - R)^2: a 0.005, b 0.405, c 0.08, d 0.08, e 0.125, f 0.125; grads v - R:
    # a -0.1, b 0.9, c -0.4, d -0.4, e -0.5, f 0.5. Nothing is clipped.
    values_BT = _values()
    loss_BT, metrics = clipped_value_loss(values_BT, OLD_BT, RETURNS_BT, MASK_BT, clip=0.0)
    torch.testing.assert_close(
        loss_BT.detach(), torch.tensor([[0.005, 0.405, 0.08, 0.08], [0.125, 0.125, 0.0, 0.0]], dtype=F64)
    )
    loss_BT.sum().backward()
    torch.testing.assert_close(
        values_BT.grad, torch.tensor([[-0.1, 0.9, -0.4, -0.4], [-0.5, 0.5, 0.0, 0.0]], dtype=F64)
    )
    assert metrics["value_clip_fraction"].item() == 0.0
    # A clip range wider than any move is the same loss.
    wide_BT, wide_metrics = clipped_value_loss(VALUES_BT, OLD_BT, RETURNS_BT, MASK_BT, clip=1e6)
    torch.testing.assert_close(wide_BT, loss_BT.detach())
    assert wide_metrics["value_clip_fraction"].item() == 0.0


def test_gradient_flows_only_through_values():
    values_BT = _values()
    old_BT = OLD_BT.clone().requires_grad_(True)
    returns_BT = RETURNS_BT.clone().requires_grad_(True)
    loss, _ = value_loss(values_BT, old_BT, returns_BT, MASK_BT, clip=0.2)
    loss.backward()
    assert old_BT.grad is None and returns_BT.grad is None
    assert values_BT.grad.abs().sum() > 0
    assert torch.equal(values_BT.grad[~MASK_BT], torch.zeros(2, dtype=F64))  # padding gets nothing


def test_padding_may_hold_anything():
    values_BT = VALUES_BT.clone()
    values_BT[1, 2:] = math.nan
    old_BT = OLD_BT.clone()
    old_BT[1, 3] = math.inf
    values_BT.requires_grad_(True)
    loss, metrics = value_loss(values_BT, old_BT, RETURNS_BT, MASK_BT, clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(1.055 / 6)
    assert metrics["value_mean"].item() == pytest.approx(1.4 / 6)
    assert torch.isfinite(values_BT.grad).all()


def test_nothing_valid_gives_a_zero_loss_that_backpropagates():
    values_BT = _values()
    loss, metrics = value_loss(values_BT, OLD_BT, RETURNS_BT, torch.zeros_like(MASK_BT))
    loss.backward()
    assert loss.item() == 0.0 and metrics["tokens"].item() == 0
    assert metrics["value_clip_fraction"].item() == 0.0 and metrics["value_mean"].item() == 0.0
    assert torch.equal(values_BT.grad, torch.zeros_like(VALUES_BT))


@pytest.mark.parametrize("loss_agg", LOSS_AGGREGATIONS)
def test_dp_halves_with_global_normaliser_sum_to_the_full_loss(loss_agg):
    gen = torch.Generator().manual_seed(0)
    old_BT = torch.randn(6, 5, generator=gen, dtype=F64)
    values_BT = (old_BT + 0.3 * torch.randn(6, 5, generator=gen, dtype=F64)).requires_grad_(True)
    returns_BT = old_BT + torch.randn(6, 5, generator=gen, dtype=F64)
    lengths_B = torch.tensor([5, 1, 2, 0, 4, 3])
    mask_BT = torch.arange(5).unsqueeze(0) < lengths_B.unsqueeze(1)

    def loss_of(rows, **normaliser):
        args = dict(clip=0.2, loss_agg=loss_agg, max_len=5, **normaliser)
        return value_loss(values_BT[rows], old_BT[rows], returns_BT[rows], mask_BT[rows], **args)

    full, metrics = loss_of(slice(None))
    assert 0 < metrics["value_clip_fraction"].item() < 1  # both branches present
    (full_grad,) = torch.autograd.grad(full, values_BT)
    halves = (slice(0, 2), slice(2, 6))
    total = sum(loss_normalizer(mask_BT[rows], loss_agg) for rows in halves)
    key = "global_tokens" if loss_agg == "token-mean" else "global_seqs"
    summed = sum(loss_of(rows, **{key: total})[0] for rows in halves)
    (summed_grad,) = torch.autograd.grad(summed, values_BT)
    torch.testing.assert_close(summed, full)
    torch.testing.assert_close(summed_grad, full_grad)


def test_bad_input_is_named():
    x_BT = torch.zeros(2, 3)
    mask_BT = torch.ones(2, 3)
    with pytest.raises(ValueError, match="value clip must be >= 0"):
        clipped_value_loss(x_BT, x_BT, x_BT, mask_BT, clip=-0.1)
    with pytest.raises(ValueError, match="old_values_BT has shape"):
        value_loss(x_BT, torch.zeros(2, 4), x_BT, mask_BT)
    with pytest.raises(ValueError, match="returns_BT has shape"):
        value_loss(x_BT, x_BT, torch.zeros(3), mask_BT)
    with pytest.raises(ValueError, match=r"values_BT must be \[B, T\]"):
        value_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        value_loss(x_BT, x_BT, x_BT, mask_BT, loss_agg="mean")
    with pytest.raises(ValueError, match="needs max_len"):
        value_loss(x_BT, x_BT, x_BT, mask_BT, loss_agg="seq-mean-token-sum-norm")
