"""Loss aggregation modes by hand, and the data-parallel normaliser equivalence."""

import pytest
import torch

from megatron_rl.algorithms import LOSS_AGGREGATIONS, aggregate_loss, loss_normalizer

# Padded positions hold 100 so that any leak of a masked value shows in the result.
LOSS_BT = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
MASK_BT = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


def test_modes_by_hand():
    # token-mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    # seq-mean-token-mean: (6/3 + 4/1) / 2 sequences = (2 + 4) / 2 = 3
    # seq-mean-token-sum-norm, max_len 4: (6/4 + 4/4) / 2 = (1.5 + 1) / 2 = 1.25
    assert aggregate_loss(LOSS_BT, MASK_BT, "token-mean").item() == pytest.approx(2.5)
    assert aggregate_loss(LOSS_BT, MASK_BT, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate_loss(LOSS_BT, MASK_BT, "seq-mean-token-sum-norm", max_len=4).item() == pytest.approx(
        1.25
    )
    # max_len is a constant, not the batch's longest: with 8 -> (6/8 + 4/8) / 2 = 0.625
    assert aggregate_loss(LOSS_BT, MASK_BT, "seq-mean-token-sum-norm", max_len=8).item() == pytest.approx(
        0.625
    )


def test_fully_masked_sequence_does_not_dilute():
    # Appending a fully masked row (as overlong_mask leaves a truncated sample) changes nothing.
    loss_BT = torch.cat([LOSS_BT, torch.full((1, 4), 7.0)])
    mask_BT = torch.cat([MASK_BT, torch.zeros(1, 4, dtype=torch.bool)])
    assert aggregate_loss(loss_BT, mask_BT, "token-mean").item() == pytest.approx(2.5)
    assert aggregate_loss(loss_BT, mask_BT, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate_loss(loss_BT, mask_BT, "seq-mean-token-sum-norm", max_len=4).item() == pytest.approx(
        1.25
    )
    assert loss_normalizer(mask_BT, "token-mean").item() == 4
    assert loss_normalizer(mask_BT, "seq-mean-token-mean").item() == 2


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_all_masked_gives_zero_loss_that_backpropagates(mode):
    # A DP rank whose whole micro-batch is masked must still be able to call backward.
    loss_BT = torch.ones(2, 3, requires_grad=True)
    loss = aggregate_loss(loss_BT, torch.zeros(2, 3, dtype=torch.bool), mode, max_len=3)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(loss_BT.grad, torch.zeros(2, 3))


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_dp_halves_with_global_normaliser_sum_to_full_loss(mode):
    # A loss that depends on a parameter, over 6 sequences of very different lengths, split into two
    # "ranks" of 3. With the global normaliser the half losses and their gradients add up to the full
    # batch's; with each half's own normaliser they do not (the halves hold 1+2+3 vs 8+8+0 tokens).
    gen = torch.Generator().manual_seed(0)
    weights_T = torch.randn(8, generator=gen, dtype=torch.float64, requires_grad=True)
    x_BT = torch.randn(6, 8, generator=gen, dtype=torch.float64)
    lengths_B = torch.tensor([1, 2, 3, 8, 8, 0])
    mask_BT = torch.arange(8).unsqueeze(0) < lengths_B.unsqueeze(1)

    def loss_of(rows, **normaliser):
        return aggregate_loss((x_BT[rows] * weights_T).square(), mask_BT[rows], mode, max_len=8, **normaliser)

    full = loss_of(slice(None))
    (full_grad,) = torch.autograd.grad(full, weights_T)

    halves = (slice(0, 3), slice(3, 6))
    total = sum(loss_normalizer(mask_BT[rows], mode) for rows in halves)
    key = "global_tokens" if mode == "token-mean" else "global_seqs"
    summed = sum(loss_of(rows, **{key: total}) for rows in halves)
    (summed_grad,) = torch.autograd.grad(summed, weights_T)
    torch.testing.assert_close(summed, full)
    torch.testing.assert_close(summed_grad, full_grad)

    # Averaging local means (what DDP does with locally normalised losses) is a different loss.
    local_mean = sum(loss_of(rows) for rows in halves) / 2
    assert not torch.isclose(local_mean, full)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        aggregate_loss(LOSS_BT, MASK_BT, "sum")
    with pytest.raises(ValueError, match="needs max_len"):
        aggregate_loss(LOSS_BT, MASK_BT, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="pass global_tokens, not global_seqs"):
        aggregate_loss(LOSS_BT, MASK_BT, "token-mean", global_seqs=2)
    with pytest.raises(ValueError, match="pass global_seqs, not global_tokens"):
        aggregate_loss(LOSS_BT, MASK_BT, "seq-mean-token-mean", global_tokens=4)
    with pytest.raises(ValueError, match="mask_BT has shape"):
        aggregate_loss(LOSS_BT, MASK_BT[:, :2])
