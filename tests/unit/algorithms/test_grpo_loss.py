"""grpo_loss on toy policies: a hand-computed case, finite differences, and DP equivalence.

The toy policy has no context: a logits vector per position over a vocabulary of two tokens, so
log pi(x_t) = log_softmax(theta_t)[x_t] and d log pi(x) / d theta = onehot(x) - softmax(theta).
"""

import math

import pytest
import torch

from megatron_rl.algorithms import LOSS_AGGREGATIONS, group_advantages, grpo_loss, loss_normalizer


def _token_logprobs(theta_TV: torch.Tensor, tokens_BT: torch.Tensor) -> torch.Tensor:
    logprobs_BTV = torch.log_softmax(theta_TV, dim=-1).expand(tokens_BT.shape[0], -1, -1)
    return logprobs_BTV.gather(-1, tokens_BT.unsqueeze(-1)).squeeze(-1)


def test_two_token_policy_by_hand():
    # One logits vector shared by both positions. theta = [0, 0] -> p = [0.5, 0.5];
    # old p = [0.4, 0.6] -> ratio(token 0) = 1.25, ratio(token 1) = 0.5/0.6 = 5/6;
    # ref p = [0.25, 0.75]. Sequences: [0, 1] with A = +1, and [1, pad] with A = -2.
    # clip 0.2 both sides, token-mean over 3 tokens, k3 KL with coef 0.1.
    #
    # Surrogate per token: seq0 tok0 r=1.25 > 1.2, A>0 -> clipped: -1.2, d/dlogp 0
    #                      seq0 tok1 r=5/6 in [0.8, 1.2]      -> -5/6, d/dlogp -5/6
    #                      seq1 tok0 r=5/6, A=-2              -> +5/3, d/dlogp +5/3
    #   mean: (-1.2 - 5/6 + 5/3) / 3 = -11/90 = -0.122222
    #   grad: (1/3) * (-5/6 + 5/3) * (onehot(1) - p) = (1/3)(5/6)(-0.5, 0.5) = (-5/36, 5/36)
    # k3 per token (exp(ref - logp) - (ref - logp) - 1):
    #   token 0: 0.5 + ln 2 - 1 = 0.193147;  token 1: 1.5 - ln 1.5 - 1 = 0.094535 (twice)
    #   mean: (0.193147 + 2 * 0.094535) / 3 = 0.127406; times 0.1 -> 0.0127406
    #   d k3 / d logp = 1 - exp(ref - logp): token 0 -> 0.5, token 1 -> -0.5
    #   grad: (0.1/3) * (0.5 * (0.5, -0.5) + 2 * -0.5 * (-0.5, 0.5)) = (0.1/3)(0.75, -0.75) = (0.025, -0.025)
    # Total loss -0.122222 + 0.012741 = -0.109482; grad (-5/36 + 0.025, 5/36 - 0.025) = (-0.113889, 0.113889).
    theta_V = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    tokens_BT = torch.tensor([[0, 1], [1, 0]])
    mask_BT = torch.tensor([[True, True], [True, False]])
    old_BT = _token_logprobs(torch.tensor([0.4, 0.6], dtype=torch.float64).log().expand(2, 2), tokens_BT)
    ref_BT = _token_logprobs(torch.tensor([0.25, 0.75], dtype=torch.float64).log().expand(2, 2), tokens_BT)
    loss, metrics = grpo_loss(
        _token_logprobs(theta_V.expand(2, 2), tokens_BT),
        old_BT,
        torch.tensor([1.0, -2.0], dtype=torch.float64),
        mask_BT,
        clip_low=0.2,
        clip_high=0.2,
        ref_logprobs_BT=ref_BT,
        kl_coef=0.1,
        kl_estimator="k3",
    )
    loss.backward()
    kl_mean = (math.log(2) - 0.5 + 2 * (0.5 - math.log(1.5))) / 3
    assert loss.item() == pytest.approx(-11 / 90 + 0.1 * kl_mean, abs=1e-12)
    assert loss.item() == pytest.approx(-0.109482, abs=1e-6)
    torch.testing.assert_close(
        theta_V.grad, torch.tensor([-5 / 36 + 0.025, 5 / 36 - 0.025], dtype=torch.float64)
    )
    assert metrics["pg_loss"].item() == pytest.approx(-11 / 90)
    assert metrics["kl"].item() == pytest.approx(kl_mean)
    assert metrics["clip_fraction"].item() == pytest.approx(1 / 3)
    assert metrics["clip_high_fraction"].item() == pytest.approx(1 / 3)
    assert metrics["ratio_mean"].item() == pytest.approx((1.25 + 2 * 5 / 6) / 3)
    assert metrics["ratio_max"].item() == pytest.approx(1.25)
    assert metrics["tokens"].item() == 3
    assert not any(value.requires_grad for value in metrics.values())


def _toy_batch(seed: int):
    """Six sequences (two groups of three) of up to 4 tokens; old/ref/rollout policies nearby."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    theta_TV = randn(4, 2)
    tokens_BT = torch.randint(0, 2, (6, 4), generator=gen)
    lengths_B = torch.tensor([4, 1, 3, 0, 2, 4])
    mask_BT = torch.arange(4).unsqueeze(0) < lengths_B.unsqueeze(1)
    old_BT = _token_logprobs(theta_TV + 0.3 * randn(4, 2), tokens_BT)
    ref_BT = _token_logprobs(theta_TV + 0.5 * randn(4, 2), tokens_BT)
    rollout_BT = old_BT + 0.3 * randn(6, 4)
    advantages_B = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]), 3)
    return theta_TV, tokens_BT, mask_BT, old_BT, ref_BT, rollout_BT, advantages_B


@pytest.mark.parametrize("loss_agg", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3"])
def test_gradient_matches_central_finite_differences(loss_agg, kl_estimator):
    theta_TV, tokens_BT, mask_BT, old_BT, ref_BT, rollout_BT, advantages_B = _toy_batch(seed=1)
    kwargs = dict(
        clip_low=0.2,
        clip_high=0.28,
        ref_logprobs_BT=ref_BT,
        kl_coef=0.05,
        kl_estimator=kl_estimator,
        loss_agg=loss_agg,
        max_len=4,
        rollout_logprobs_BT=rollout_BT,
        truncated_is_cap=1.2,
    )

    def loss_at(theta):
        return grpo_loss(_token_logprobs(theta, tokens_BT), old_BT, advantages_B, mask_BT, **kwargs)

    theta_TV.requires_grad_(True)
    loss, metrics = loss_at(theta_TV)
    (grad_TV,) = torch.autograd.grad(loss, theta_TV)

    # The check covers both branches of the clip, and no ratio sits on a kink (where FD is meaningless).
    assert 0 < metrics["clip_fraction"].item() < 1
    ratio_BT = torch.exp(_token_logprobs(theta_TV.detach(), tokens_BT) - old_BT)[mask_BT]
    assert torch.min((ratio_BT - 0.8).abs().min(), (ratio_BT - 1.28).abs().min()) > 1e-3
    assert metrics["is_weight_mean"].item() < 1.2  # some weights were capped

    h = 1e-6
    fd_TV = torch.zeros_like(theta_TV)
    with torch.no_grad():
        for index in range(theta_TV.numel()):
            step_TV = torch.zeros_like(theta_TV).view(-1)
            step_TV[index] = h
            step_TV = step_TV.view_as(theta_TV)
            plus, _ = loss_at(theta_TV + step_TV)
            minus, _ = loss_at(theta_TV - step_TV)
            fd_TV.view(-1)[index] = (plus - minus) / (2 * h)
    torch.testing.assert_close(grad_TV, fd_TV, rtol=1e-6, atol=1e-8)
    assert grad_TV.abs().max() > 1e-3  # a zero gradient would pass trivially


@pytest.mark.parametrize("loss_agg", LOSS_AGGREGATIONS)
def test_dp_halves_sum_to_the_full_loss(loss_agg):
    # Two "ranks" of three sequences each; normaliser summed over both as an all-reduce would.
    theta_TV, tokens_BT, mask_BT, old_BT, ref_BT, _, advantages_B = _toy_batch(seed=2)
    theta_TV.requires_grad_(True)
    kwargs = dict(
        clip_low=0.2, clip_high=0.28, ref_logprobs_BT=ref_BT, kl_coef=0.1, loss_agg=loss_agg, max_len=4
    )

    def loss_of(rows, **normaliser):
        args = dict(kwargs, ref_logprobs_BT=ref_BT[rows], **normaliser)
        logprobs_BT = _token_logprobs(theta_TV, tokens_BT[rows])
        return grpo_loss(logprobs_BT, old_BT[rows], advantages_B[rows], mask_BT[rows], **args)[0]

    full = loss_of(slice(None))
    (full_grad,) = torch.autograd.grad(full, theta_TV)
    halves = (slice(0, 3), slice(3, 6))
    total = sum(loss_normalizer(mask_BT[rows], loss_agg) for rows in halves)
    key = "global_tokens" if loss_agg == "token-mean" else "global_seqs"
    summed = sum(loss_of(rows, **{key: total}) for rows in halves)
    (summed_grad,) = torch.autograd.grad(summed, theta_TV)
    torch.testing.assert_close(summed, full)
    torch.testing.assert_close(summed_grad, full_grad)


def test_kl_is_a_metric_only_without_coef():
    theta_TV, tokens_BT, mask_BT, old_BT, ref_BT, _, advantages_B = _toy_batch(seed=3)
    logprobs_BT = _token_logprobs(theta_TV, tokens_BT)
    with_ref, metrics = grpo_loss(logprobs_BT, old_BT, advantages_B, mask_BT, ref_logprobs_BT=ref_BT)
    without_ref, _ = grpo_loss(logprobs_BT, old_BT, advantages_B, mask_BT)
    assert with_ref.item() == without_ref.item()
    assert metrics["kl"].item() > 0


def test_all_equal_rewards_and_full_mask_give_no_policy_gradient():
    # Zero advantages everywhere (all-equal group) -> zero surrogate gradient.
    theta_TV, tokens_BT, mask_BT, old_BT, _, _, _ = _toy_batch(seed=4)
    theta_TV.requires_grad_(True)
    zero_advantages_B = group_advantages(torch.ones(6), 3)
    loss, _ = grpo_loss(_token_logprobs(theta_TV, tokens_BT), old_BT, zero_advantages_B, mask_BT)
    loss.backward()
    assert torch.equal(theta_TV.grad, torch.zeros_like(theta_TV))
    # Nothing valid at all -> a zero loss that still backpropagates.
    theta_TV.grad = None
    loss, metrics = grpo_loss(
        _token_logprobs(theta_TV, tokens_BT), old_BT, torch.ones(6), torch.zeros_like(mask_BT)
    )
    loss.backward()
    assert loss.item() == 0.0 and metrics["tokens"].item() == 0
    assert torch.equal(theta_TV.grad, torch.zeros_like(theta_TV))


def test_bad_input_is_named():
    x_BT = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="needs ref_logprobs_BT"):
        grpo_loss(x_BT, x_BT, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)
    with pytest.raises(ValueError, match="needs rollout_logprobs_BT"):
        grpo_loss(x_BT, x_BT, torch.zeros(2), torch.ones(2, 3), truncated_is_cap=2.0)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        grpo_loss(x_BT, x_BT, torch.zeros(2), torch.ones(2, 3), loss_agg="mean")
