"""PPO's advantages: token rewards, GAE, whitening and explained variance, by hand and against
plain-Python references; observation tokens skipped; the DP statistics equal the single-process ones."""

import math

import pytest
import torch

import megatron_rl.algorithms as algorithms
from megatron_rl.algorithms import (
    explained_variance_from,
    explained_variance_sums,
    gae_advantages,
    moments,
    token_rewards,
    whiten,
)
from megatron_rl.algorithms.gae import ADVANTAGE_WHITENING
from megatron_rl.config import choices

F64 = torch.float64


def reference_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE over lists: each row's valid tokens taken out, the recursion run over them alone,
    the results put back at their positions (0 elsewhere)."""
    advantages, returns = [], []
    for rewards_row, values_row, mask_row in zip(rewards, values, mask, strict=True):
        kept = [t for t, valid in enumerate(mask_row) if valid]
        advantages_row = [0.0] * len(mask_row)
        returns_row = [0.0] * len(mask_row)
        next_value = next_advantage = 0.0
        for t in reversed(kept):
            delta = rewards_row[t] + gamma * next_value - values_row[t]
            next_advantage = delta + gamma * lam * next_advantage
            next_value = values_row[t]
            advantages_row[t] = next_advantage
            returns_row[t] = next_advantage + values_row[t]
        advantages.append(advantages_row)
        returns.append(returns_row)
    return advantages, returns


def _random_batch(seed: int, B: int = 5, T: int = 9):
    """Rewards and values with garbage (large numbers) at masked positions; masks with holes
    (observation tokens), padding and one row with no valid token."""
    gen = torch.Generator().manual_seed(seed)
    rewards_BT = torch.randn(B, T, generator=gen, dtype=F64)
    values_BT = torch.randn(B, T, generator=gen, dtype=F64)
    mask_BT = torch.rand(B, T, generator=gen) < 0.7
    mask_BT[0] = False
    mask_BT[1, 6:] = False
    rewards_BT = torch.where(mask_BT, rewards_BT, 1e3)
    values_BT = torch.where(mask_BT, values_BT, -1e3)
    return rewards_BT, values_BT, mask_BT


# ---- GAE ----------------------------------------------------------------------------------------


def test_gae_by_hand():
    # gamma 0.9, lam 0.8 -> gamma * lam = 0.72.
    # Row 0, all valid: rewards [0, 0, 0, 1], values [0.5, 0.4, 0.6, 0.8].
    #   t=3: delta = 1 + 0.9*0 - 0.8 = 0.2;                A3 = 0.2
    #   t=2: delta = 0 + 0.9*0.8 - 0.6 = 0.12;             A2 = 0.12 + 0.72*0.2 = 0.264
    #   t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14;             A1 = 0.14 + 0.72*0.264 = 0.33008
    #   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;            A0 = -0.14 + 0.72*0.33008 = 0.0976576
    #   returns = A + V = [0.5976576, 0.73008, 0.864, 1.0]
    # Row 1, padded after 2 tokens (pads hold 5 and 100, never read): rewards [0, 2], values [1.0, 0.5].
    #   t=1: delta = 2 + 0 - 0.5 = 1.5;                    A1 = 1.5
    #   t=0: delta = 0 + 0.9*0.5 - 1.0 = -0.55;            A0 = -0.55 + 0.72*1.5 = 0.53
    #   returns = [1.53, 2.0, 0, 0]
    rewards_BT = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 5.0, 5.0]], dtype=F64)
    values_BT = torch.tensor([[0.5, 0.4, 0.6, 0.8], [1.0, 0.5, 100.0, 100.0]], dtype=F64)
    mask_BT = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    advantages_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=0.9, lam=0.8)
    torch.testing.assert_close(
        advantages_BT, torch.tensor([[0.0976576, 0.33008, 0.264, 0.2], [0.53, 1.5, 0.0, 0.0]], dtype=F64)
    )
    torch.testing.assert_close(
        returns_BT, torch.tensor([[0.5976576, 0.73008, 0.864, 1.0], [1.53, 2.0, 0.0, 0.0]], dtype=F64)
    )


def test_observation_token_is_skipped_by_hand():
    # Row 0 of the case above with an observation token (mask 0) inserted at position 1 and the
    # value 0.4 dropped: rewards [0, obs, 0, 1], values [0.5, obs, 0.6, 0.8]. The observation's
    # reward 7 and value 9 are never read; token 0's "next" is token 2.
    #   t=3: A3 = 0.2;  t=2: A2 = 0.264 (as before)
    #   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04;   A0 = 0.04 + 0.72*0.264 = 0.23008
    #   returns = [0.73008, 0, 0.864, 1.0]
    rewards_BT = torch.tensor([[0.0, 7.0, 0.0, 1.0]], dtype=F64)
    values_BT = torch.tensor([[0.5, 9.0, 0.6, 0.8]], dtype=F64)
    mask_BT = torch.tensor([[1, 0, 1, 1]], dtype=torch.bool)
    advantages_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=0.9, lam=0.8)
    torch.testing.assert_close(advantages_BT, torch.tensor([[0.23008, 0.0, 0.264, 0.2]], dtype=F64))
    torch.testing.assert_close(returns_BT, torch.tensor([[0.73008, 0.0, 0.864, 1.0]], dtype=F64))
    # The same as the trajectory with the observation removed.
    short_advantages_BT, short_returns_BT = gae_advantages(
        rewards_BT[:, [0, 2, 3]], values_BT[:, [0, 2, 3]], torch.ones(1, 3, dtype=torch.bool), 0.9, 0.8
    )
    torch.testing.assert_close(advantages_BT[:, [0, 2, 3]], short_advantages_BT)
    torch.testing.assert_close(returns_BT[:, [0, 2, 3]], short_returns_BT)


@pytest.mark.parametrize("seed", range(4))
def test_removing_masked_tokens_changes_nothing(seed):
    # Each row, with its masked tokens cut out and the rest left-packed, gets the same advantages.
    rewards_BT, values_BT, mask_BT = _random_batch(seed)
    advantages_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=0.95, lam=0.9)
    for b in range(mask_BT.shape[0]):
        kept = mask_BT[b].nonzero().squeeze(-1)
        if kept.numel() == 0:
            assert torch.equal(advantages_BT[b], torch.zeros_like(advantages_BT[b]))
            continue
        short_a, short_r = gae_advantages(
            rewards_BT[b : b + 1, kept], values_BT[b : b + 1, kept], torch.ones(1, kept.numel()), 0.95, 0.9
        )
        torch.testing.assert_close(advantages_BT[b, kept], short_a[0])
        torch.testing.assert_close(returns_BT[b, kept], short_r[0])


@pytest.mark.parametrize("gamma, lam", [(0.9, 0.8), (0.99, 0.95), (1.0, 1.0), (0.0, 0.5), (0.7, 0.0)])
@pytest.mark.parametrize("seed", range(3))
def test_matches_the_plain_python_reference(gamma, lam, seed):
    rewards_BT, values_BT, mask_BT = _random_batch(seed)
    advantages_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma, lam)
    ref_advantages, ref_returns = reference_gae(
        rewards_BT.tolist(), values_BT.tolist(), mask_BT.tolist(), gamma, lam
    )
    torch.testing.assert_close(advantages_BT, torch.tensor(ref_advantages, dtype=F64))
    torch.testing.assert_close(returns_BT, torch.tensor(ref_returns, dtype=F64))
    assert advantages_BT[mask_BT].abs().max() > 0.1  # not trivially zero


def test_gamma_lam_one_is_return_to_go_minus_value():
    # With gamma = lam = 1 the deltas telescope: A_t = (sum of rewards from t on) - V_t, and the
    # return is the undiscounted reward-to-go, over valid tokens only.
    rewards_BT, values_BT, mask_BT = _random_batch(seed=7)
    advantages_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=1.0, lam=1.0)
    valid_rewards_BT = torch.where(mask_BT, rewards_BT, 0.0)
    to_go_BT = valid_rewards_BT.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(returns_BT, torch.where(mask_BT, to_go_BT, 0.0))
    torch.testing.assert_close(advantages_BT, torch.where(mask_BT, to_go_BT - values_BT, 0.0))


def test_one_step_and_myopic_limits():
    # lam = 0: A_t = delta_t, the one-step TD error.  gamma = 0: A_t = r_t - V_t.
    # Row [r, V] = [(1, 0.5), (2, 0.25)], gamma 0.5, lam 0:
    #   A1 = 2 - 0.25 = 1.75;  A0 = 1 + 0.5*0.25 - 0.5 = 0.625
    rewards_BT = torch.tensor([[1.0, 2.0]], dtype=F64)
    values_BT = torch.tensor([[0.5, 0.25]], dtype=F64)
    mask_BT = torch.ones(1, 2)
    torch.testing.assert_close(
        gae_advantages(rewards_BT, values_BT, mask_BT, 0.5, 0.0)[0], torch.tensor([[0.625, 1.75]], dtype=F64)
    )
    torch.testing.assert_close(
        gae_advantages(rewards_BT, values_BT, mask_BT, 0.0, 0.9)[0], torch.tensor([[0.5, 1.75]], dtype=F64)
    )


def test_masked_positions_are_never_read_and_outputs_are_targets():
    # NaN and inf at masked positions do not leak; the outputs carry no graph.
    rewards_BT = torch.tensor([[1.0, math.nan, 0.0, math.inf]], dtype=F64)
    values_BT = torch.tensor([[0.5, math.nan, 0.25, -math.inf]], dtype=F64, requires_grad=True)
    mask_BT = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    advantages_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=1.0, lam=1.0)
    # Valid tokens [r, V] = [(1, 0.5), (0, 0.25)]: A2 = -0.25, A0 = 1 + 0.25 - 0.5 + (-0.25) = 0.5.
    torch.testing.assert_close(advantages_BT, torch.tensor([[0.5, 0.0, -0.25, 0.0]], dtype=F64))
    torch.testing.assert_close(returns_BT, torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64))
    assert not advantages_BT.requires_grad and not returns_BT.requires_grad


def test_gae_dtype_is_at_least_float32():
    mask_BT = torch.ones(1, 3)
    advantages_BT, _ = gae_advantages(
        torch.ones(1, 3), torch.zeros(1, 3, dtype=torch.bfloat16), mask_BT, 0.9, 0.9
    )
    assert advantages_BT.dtype == torch.float32
    advantages_BT, _ = gae_advantages(torch.ones(1, 3), torch.zeros(1, 3, dtype=F64), mask_BT, 0.9, 0.9)
    assert advantages_BT.dtype == F64


# ---- token rewards --------------------------------------------------------------------------------


def test_token_rewards_by_hand():
    # rewards [1, 3, 5]; mask row 0 [1, 1, 0, 0] (padding), row 1 [1, 0, 1, 0] (an observation at
    # position 1, and the trailing position 3 masked), row 2 nothing valid.
    # Without KL: the reward sits on the last valid token: row 0 at 1, row 1 at 2; row 2 all zeros.
    # With kl = 0.1 * (position + 1) and coef 2: each valid token loses 2 * kl:
    #   row 0: [-0.2, 1 - 0.4, 0, 0] = [-0.2, 0.6, 0, 0]
    #   row 1: [-0.2, 0, 3 - 0.6, 0] = [-0.2, 0, 2.4, 0]
    rewards_B = torch.tensor([1.0, 3.0, 5.0], dtype=F64)
    mask_BT = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(
        token_rewards(rewards_B, mask_BT),
        torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64),
    )
    kl_BT = (0.1 * torch.arange(1, 5, dtype=F64)).expand(3, 4).clone().requires_grad_(True)
    with_kl_BT = token_rewards(rewards_B, mask_BT, kl_BT, kl_coef=2.0)
    torch.testing.assert_close(
        with_kl_BT,
        torch.tensor([[-0.2, 0.6, 0.0, 0.0], [-0.2, 0.0, 2.4, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64),
    )
    assert not with_kl_BT.requires_grad
    # kl given with coef 0: measured elsewhere, no penalty here.
    torch.testing.assert_close(
        token_rewards(rewards_B, mask_BT, kl_BT, 0.0), token_rewards(rewards_B, mask_BT)
    )


def test_token_rewards_through_gae_give_the_penalised_return():
    # gamma = lam = 1: the first token's return is the whole penalised reward, R - coef * sum(kl).
    gen = torch.Generator().manual_seed(3)
    mask_BT = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    kl_BT = torch.rand(2, 6, generator=gen, dtype=F64)
    rewards_B = torch.tensor([1.0, -1.0], dtype=F64)
    rewards_BT = token_rewards(rewards_B, mask_BT, kl_BT, kl_coef=0.1)
    _, returns_BT = gae_advantages(rewards_BT, torch.zeros(2, 6, dtype=F64), mask_BT, 1.0, 1.0)
    torch.testing.assert_close(returns_BT[:, 0], rewards_B - 0.1 * torch.where(mask_BT, kl_BT, 0.0).sum(-1))


# ---- whitening -------------------------------------------------------------------------------------

# Valid values {1, 5, 1, 5}: mean 3, population variance ((4 + 4 + 4 + 4) / 4) = 4, std 2.
# Masked positions hold 100, which would shift every statistic if it leaked.
X_BT = torch.tensor([[1.0, 5.0, 100.0, 1.0], [5.0, 100.0, 100.0, 100.0]], dtype=F64)
X_MASK_BT = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]], dtype=torch.bool)


def test_moments_and_modes_by_hand():
    # count 4, sum 1 + 5 + 1 + 5 = 12, sum of squares 1 + 25 + 1 + 25 = 52.
    torch.testing.assert_close(moments(X_BT, X_MASK_BT), torch.tensor([4.0, 12.0, 52.0], dtype=F64))
    # batch: (x - 3) / 2 -> 1 -> -1, 5 -> 1.   scale: x / 2 -> 0.5, 2.5.   none: x.
    torch.testing.assert_close(
        whiten(X_BT, X_MASK_BT, "batch"),
        torch.tensor([[-1.0, 1.0, 0.0, -1.0], [1.0, 0.0, 0.0, 0.0]], dtype=F64),
    )
    torch.testing.assert_close(
        whiten(X_BT, X_MASK_BT, "scale"),
        torch.tensor([[0.5, 2.5, 0.0, 0.5], [2.5, 0.0, 0.0, 0.0]], dtype=F64),
    )
    torch.testing.assert_close(
        whiten(X_BT, X_MASK_BT, "none"), torch.tensor([[1.0, 5.0, 0.0, 1.0], [5.0, 0.0, 0.0, 0.0]], dtype=F64)
    )


def test_whitening_uses_the_given_moments():
    # Moments (count 2, sum 2, sum of squares 10): mean 1, variance 5 - 1 = 4, std 2.
    given_3 = torch.tensor([2.0, 2.0, 10.0], dtype=F64)
    torch.testing.assert_close(
        whiten(X_BT, X_MASK_BT, "batch", moments_3=given_3),
        torch.tensor([[0.0, 2.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]], dtype=F64),
    )
    # Constant values and eps: a zero std divides by eps only, centred values stay exactly 0.
    constant_BT = torch.full((1, 3), 2.5, dtype=torch.float32)
    assert torch.equal(whiten(constant_BT, torch.ones(1, 3), "batch"), torch.zeros(1, 3))
    assert whiten(constant_BT, torch.ones(1, 3), "batch").dtype == torch.float32


@pytest.mark.parametrize("mode", ["batch", "scale"])
def test_whitening_over_two_ranks_equals_the_concatenation(mode):
    # Two "ranks" with different token counts; their moments summed as an all-reduce would.
    gen = torch.Generator().manual_seed(0)
    x_BT = torch.randn(6, 7, generator=gen, dtype=F64) * 3 + 2
    lengths_B = torch.tensor([7, 1, 2, 6, 0, 5])
    mask_BT = torch.arange(7).unsqueeze(0) < lengths_B.unsqueeze(1)
    halves = (slice(0, 2), slice(2, 6))
    total_3 = sum(moments(x_BT[rows], mask_BT[rows]) for rows in halves)
    joined_BT = torch.cat([whiten(x_BT[rows], mask_BT[rows], mode, moments_3=total_3) for rows in halves])
    torch.testing.assert_close(joined_BT, whiten(x_BT, mask_BT, mode))
    # Against torch's own population statistics of the valid tokens.
    valid = x_BT[mask_BT]
    shift = valid.mean() if mode == "batch" else 0.0
    expected_BT = torch.where(mask_BT, (x_BT - shift) / (valid.std(correction=0) + 1e-8), 0.0)
    torch.testing.assert_close(joined_BT, expected_BT)
    # Each rank's own statistics give something else.
    local_BT = torch.cat([whiten(x_BT[rows], mask_BT[rows], mode) for rows in halves])
    assert not torch.allclose(local_BT, joined_BT)


def test_whitening_modes_are_the_recipe_choices():
    assert ADVANTAGE_WHITENING is choices.ADVANTAGE_WHITENING
    assert ADVANTAGE_WHITENING == ("batch", "scale", "none")
    for mode in ADVANTAGE_WHITENING:
        whiten(X_BT, X_MASK_BT, mode)


# ---- explained variance --------------------------------------------------------------------------


def test_explained_variance_by_hand():
    # Valid R = [1, 2, 3, 4], V = [1, 2, 2, 4] -> D = R - V = [0, 0, 1, 0].
    # Var(R) = 30/4 - 2.5^2 = 1.25;  Var(D) = 1/4 - (1/4)^2 = 0.1875;  EV = 1 - 0.1875 / 1.25 = 0.85.
    returns_BT = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, 100.0]], dtype=F64)
    values_BT = torch.tensor([[1.0, 2.0, -50.0], [2.0, 4.0, -50.0]], dtype=F64)
    mask_BT = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    sums_5 = explained_variance_sums(values_BT, returns_BT, mask_BT)
    torch.testing.assert_close(sums_5, torch.tensor([4.0, 10.0, 30.0, 1.0, 1.0], dtype=F64))
    assert explained_variance_from(sums_5) == pytest.approx(0.85)
    assert explained_variance_from([4.0, 10.0, 30.0, 1.0, 1.0]) == pytest.approx(0.85)
    assert isinstance(explained_variance_from(sums_5), float)


def test_explained_variance_limits():
    gen = torch.Generator().manual_seed(1)
    returns_BT = torch.randn(3, 5, generator=gen, dtype=F64)
    mask_BT = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)

    def ev(values_BT, returns=returns_BT):
        return explained_variance_from(explained_variance_sums(values_BT, returns, mask_BT))

    assert ev(returns_BT.clone()) == pytest.approx(1.0)  # perfect values
    assert ev(returns_BT + 3.0) == pytest.approx(1.0)  # a constant offset: Var(R - V) = 0
    assert ev(torch.full_like(returns_BT, 7.0)) == pytest.approx(0.0, abs=1e-12)  # a constant
    assert ev(2 * returns_BT) == pytest.approx(0.0, abs=1e-12)  # D = -R: Var(D) = Var(R)
    assert ev(3 * returns_BT) == pytest.approx(-3.0)  # D = -2R: Var(D) = 4 Var(R)
    # Returns that do not vary: NaN. 0.1 over 7 tokens: E[R^2] - E[R]^2 = 1.7e-18 in float64, not 0.
    values_17 = torch.randn(1, 7, generator=gen, dtype=F64)
    constant_17 = torch.full((1, 7), 0.1, dtype=F64)
    assert math.isnan(
        explained_variance_from(explained_variance_sums(values_17, constant_17, torch.ones(1, 7)))
    )
    assert math.isnan(ev(torch.randn(3, 5, generator=gen, dtype=F64), torch.full((3, 5), 2.0, dtype=F64)))
    assert math.isnan(explained_variance_from(torch.zeros(5, dtype=F64)))  # no tokens


def test_explained_variance_over_two_ranks_equals_the_whole_batch():
    gen = torch.Generator().manual_seed(2)
    returns_BT = torch.randn(6, 5, generator=gen, dtype=F64)
    values_BT = returns_BT + 0.5 * torch.randn(6, 5, generator=gen, dtype=F64)
    lengths_B = torch.tensor([5, 1, 0, 3, 4, 2])
    mask_BT = torch.arange(5).unsqueeze(0) < lengths_B.unsqueeze(1)
    halves = (slice(0, 2), slice(2, 6))
    total_5 = sum(explained_variance_sums(values_BT[r], returns_BT[r], mask_BT[r]) for r in halves)
    full = explained_variance_from(explained_variance_sums(values_BT, returns_BT, mask_BT))
    assert explained_variance_from(total_5) == pytest.approx(full, rel=1e-12)
    # Against torch's population variances of the valid tokens.
    valid_r, valid_d = returns_BT[mask_BT], (returns_BT - values_BT)[mask_BT]
    assert full == pytest.approx(1 - (valid_d.var(correction=0) / valid_r.var(correction=0)).item())
    assert 0 < full < 1


# ---- the package and bad input ---------------------------------------------------------------------


def test_package_names_the_functions_not_the_modules():
    # Importing the submodules binds them on the package: no function may share a module's name.
    import megatron_rl.algorithms.gae  # noqa: F401
    import megatron_rl.algorithms.value  # noqa: F401

    assert algorithms.gae_advantages is gae_advantages
    assert callable(algorithms.value_loss) and algorithms.value_loss.__name__ == "value_loss"
    modules = {w for w in algorithms._WHERE.values()}
    assert not modules & set(algorithms._WHERE), "a function named like its module would be shadowed"
    assert {
        "gae_advantages",
        "token_rewards",
        "whiten",
        "moments",
        "value_loss",
        "clipped_value_loss",
    } <= set(algorithms.__all__)


def test_bad_input_is_named():
    x_BT = torch.zeros(2, 3)
    mask_BT = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"gamma \(the discount\) must be in \[0, 1\]; got 1.5"):
        gae_advantages(x_BT, x_BT, mask_BT, 1.5, 0.9)
    with pytest.raises(ValueError, match=r"lam \(GAE's lambda\) must be in \[0, 1\]; got -0.1"):
        gae_advantages(x_BT, x_BT, mask_BT, 0.9, -0.1)
    with pytest.raises(ValueError, match="must be in"):
        gae_advantages(x_BT, x_BT, mask_BT, math.nan, 0.9)
    with pytest.raises(ValueError, match="rewards_BT has shape"):
        gae_advantages(torch.zeros(2, 4), x_BT, mask_BT, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"values_BT must be \[B, T\]"):
        gae_advantages(torch.zeros(3), torch.zeros(3), torch.ones(3), 0.9, 0.9)
    with pytest.raises(ValueError, match="mask_BT must be boolean or hold only 0 and 1"):
        gae_advantages(x_BT, x_BT, torch.full((2, 3), 0.5), 0.9, 0.9)
    with pytest.raises(ValueError, match="one reward per sequence"):
        token_rewards(torch.zeros(3), mask_BT)
    with pytest.raises(ValueError, match="kl_coef > 0 needs kl_BT"):
        token_rewards(torch.zeros(2), mask_BT, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        token_rewards(torch.zeros(2), mask_BT, x_BT, kl_coef=-0.1)
    with pytest.raises(ValueError, match="kl_BT has shape"):
        token_rewards(torch.zeros(2), mask_BT, torch.zeros(2, 4), kl_coef=0.1)
    with pytest.raises(ValueError, match="unknown whitening mode 'std'; choose one of batch, scale, none"):
        whiten(x_BT, mask_BT, "std")
    with pytest.raises(ValueError, match=r"moments_3 \(count, sum, sum of squares\) must hold exactly 3"):
        whiten(x_BT, mask_BT, "batch", moments_3=torch.zeros(5))
    with pytest.raises(ValueError, match="eps must be > 0"):
        whiten(x_BT, mask_BT, "batch", eps=0.0)
    with pytest.raises(ValueError, match="mask_BT has shape"):
        moments(x_BT, torch.ones(2, 4))
    with pytest.raises(ValueError, match="returns_BT has shape"):
        explained_variance_sums(x_BT, torch.zeros(3, 3), mask_BT)
    with pytest.raises(ValueError, match="must hold exactly 5 numbers"):
        explained_variance_from([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="is a token count and must be >= 0"):
        explained_variance_from([-1.0, 0.0, 0.0, 0.0, 0.0])
