"""KL estimators and the KL reward penalty, checked by hand and against an exact expectation."""

import math

import pytest
import torch

from megatron_rl.algorithms import kl_estimate, kl_penalty_rewards

LN2 = math.log(2.0)


def test_estimators_by_hand():
    # logp = ln 0.5, logp_ref = ln 0.25 -> d = logp - logp_ref = ln 2 = 0.693147.
    #   k1 = d = 0.693147;  k2 = d^2 / 2 = 0.240227;  k3 = exp(-d) + d - 1 = 0.5 + 0.693147 - 1 = 0.193147.
    # Swapped (d = -ln 2): k3 = exp(ln 2) - ln 2 - 1 = 2 - 0.693147 - 1 = 0.306853.
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[LN2, -LN2]]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.5 * LN2**2, 0.5 * LN2**2]]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[LN2 - 0.5, 1.0 - LN2]]))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_zero_when_policies_agree(estimator):
    logp = torch.log(torch.tensor([[0.3, 0.7, 0.01]]))
    assert torch.equal(kl_estimate(logp, logp.clone(), estimator), torch.zeros(1, 3))


def test_k1_and_k3_are_unbiased_exactly():
    # p = [0.5, 0.25, 0.25], q = [0.25, 0.25, 0.5]:
    # KL(p || q) = 0.5 ln 2 + 0.25 ln 1 + 0.25 ln 0.5 = 0.25 ln 2 = 0.173287.
    # The expectation over tokens x ~ p is the p-weighted sum over the vocabulary.
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    for estimator in ("k1", "k3"):
        expectation = (p * kl_estimate(p.log(), q.log(), estimator)).sum()
        assert expectation.item() == pytest.approx(0.25 * LN2, abs=1e-12)
    # k2 is biased: E[d^2 / 2] = 0.5 * (0.5 ln^2 2 + 0.25 ln^2 2) = 0.375 ln^2 2 = 0.180166.
    assert (p * kl_estimate(p.log(), q.log(), "k2")).sum().item() == pytest.approx(0.375 * LN2**2)


def test_k3_gradient_by_hand():
    # d k3 / d logp = 1 - exp(logp_ref - logp); at logp = ln 0.5, ref = ln 0.25: 1 - 0.5 = 0.5.
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]], requires_grad=True)
    kl_estimate(logp, ref, "k3").sum().backward()
    assert logp.grad.item() == pytest.approx(0.5)
    assert ref.grad is None  # the reference is frozen


def test_penalty_per_sequence_and_per_token_by_hand():
    # kl = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], mask = [[1, 1, 0], [1, 0, 0]], coef 0.5, rewards [1, 0].
    # Per sequence: 1 - 0.5 * (0.1 + 0.2) = 0.85;  0 - 0.5 * 0.4 = -0.2.
    # Per token: row 0 = [-0.05, -0.1 + 1 (reward at the last valid token), 0] = [-0.05, 0.9, 0];
    #            row 1 = [-0.2 + 0 (reward 0), 0, 0].
    kl_BT = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask_BT = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    rewards_B = torch.tensor([1.0, 0.0])
    torch.testing.assert_close(kl_penalty_rewards(rewards_B, kl_BT, mask_BT, 0.5), torch.tensor([0.85, -0.2]))
    per_token_BT = kl_penalty_rewards(rewards_B, kl_BT, mask_BT, 0.5, per_token=True)
    torch.testing.assert_close(per_token_BT, torch.tensor([[-0.05, 0.9, 0.0], [-0.2, 0.0, 0.0]]))


def test_penalty_edge_cases():
    # A hole in the mask: the last valid token is position 2, not 0. A fully masked row gets zeros.
    # Row 0: kl 1 at valid positions 0 and 2, coef 1, reward 5 -> [-1, 0, -1 + 5] = [-1, 0, 4].
    kl_BT = torch.ones(2, 3, requires_grad=True)
    mask_BT = torch.tensor([[1, 0, 1], [0, 0, 0]], dtype=torch.bool)
    rewards_B = torch.tensor([5.0, 7.0])
    per_token_BT = kl_penalty_rewards(rewards_B, kl_BT, mask_BT, 1.0, per_token=True)
    torch.testing.assert_close(per_token_BT, torch.tensor([[-1.0, 0.0, 4.0], [0.0, 0.0, 0.0]]))
    assert not per_token_BT.requires_grad
    # Per sequence, the fully masked row keeps its reward (no tokens, no penalty): [5 - 2, 7].
    torch.testing.assert_close(kl_penalty_rewards(rewards_B, kl_BT, mask_BT, 1.0), torch.tensor([3.0, 7.0]))


def test_bad_input_is_named():
    x_BT = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_estimate(x_BT, x_BT, "k4")
    with pytest.raises(ValueError, match="ref_logprobs_BT has shape"):
        kl_estimate(x_BT, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="one reward per sequence"):
        kl_penalty_rewards(torch.zeros(3), x_BT, torch.ones(2, 3), 0.1)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        kl_penalty_rewards(torch.zeros(2), x_BT, torch.ones(2, 3), -0.1)
