"""PPO's advantages: per-token rewards, generalised advantage estimation, whitening, explained variance.

GRPO scores a whole sample against its group. PPO uses a learned value V instead, so every token gets
its own advantage, A_t = delta_t + gamma * lam * A_{t+1} with delta_t = r_t + gamma * V_{t+1} - V_t
(Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage Estimation").
The reward of a completion is one number, so `token_rewards` puts it on the completion's last token,
with an optional KL penalty on every token (the KL as part of the reward, InstructGPT-style).

Masked tokens are transparent. A multi-turn trajectory holds observation tokens (tool output, the
environment's reply) that the policy did not write: they have no action, so no reward, value or
advantage, and the recursion steps over them as if they were not there. Token t's "next" is the next
valid token after t, and after the last valid token the episode ends (V = 0, A = 0). A trajectory
with its observation tokens removed therefore gets exactly the same advantages on its own tokens.

Whitening over data parallelism. Each DP rank holds part of the batch, and the mean and std of the
local part are not those of the batch. `moments` gives (count, sum, sum of squares) of the local
valid tokens in float64; all-reduce them (SUM over the DP group) and pass the total to `whiten`, and
every rank whitens with the batch-wide statistics, exactly as one process would with the whole
batch. `explained_variance_sums` / `explained_variance_from` do the same for the value function's
explained variance 1 - Var(R - V) / Var(R).

Shape suffixes:
    B = sequences (trajectories)
    T = completion tokens per sequence (padded)
"""

import torch

from megatron_rl.algorithms._checks import as_float_mask, check_2d, check_same_shape
from megatron_rl.algorithms.kl import kl_penalty_rewards
from megatron_rl.config.choices import ADVANTAGE_WHITENING

__all__ = [
    "ADVANTAGE_WHITENING",
    "explained_variance_from",
    "explained_variance_sums",
    "gae_advantages",
    "moments",
    "token_rewards",
    "whiten",
]


def _float_dtype(tensor: torch.Tensor) -> torch.dtype:
    return tensor.dtype if tensor.is_floating_point() else torch.get_default_dtype()


def token_rewards(
    rewards_B: torch.Tensor,
    mask_BT: torch.Tensor,
    kl_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards [B, T]: each sequence's reward on its last valid token, minus
    kl_coef * kl_BT on every valid token when `kl_BT` is given; zero on masked positions.

    The last valid token is the largest position where the mask is set (so a trailing observation
    of a multi-turn trajectory, masked, does not receive it). A sequence with no valid token gets
    all zeros: it has no action to reward. The result is detached (rewards are not differentiated).
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0 (it scales a penalty); got {kl_coef}.")
    if kl_coef > 0 and kl_BT is None:
        raise ValueError("kl_coef > 0 needs kl_BT (the per-token KL estimate to the reference).")
    check_2d("mask_BT", mask_BT)
    check_same_shape("mask_BT", mask_BT, kl_BT=kl_BT)
    if rewards_B.shape != (mask_BT.shape[0],):
        raise ValueError(
            f"rewards_B has shape {tuple(rewards_B.shape)}; expected ({mask_BT.shape[0]},), one reward "
            "per sequence of mask_BT."
        )
    if kl_BT is None:
        kl_BT = torch.zeros(mask_BT.shape, dtype=_float_dtype(rewards_B), device=mask_BT.device)
    return kl_penalty_rewards(rewards_B, kl_BT, mask_BT, kl_coef, per_token=True)


def gae_advantages(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) by generalised advantage estimation, backwards over T.

    For a valid token t, with "next" the next valid token after t (V_next = A_next = 0 after the
    last one: the episode ends there):
        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lam * A_next
        R_t     = A_t + V_t   (the value target)
    Masked positions (padding, observation tokens) are skipped: their rewards and values are never
    read (they may hold anything, NaN included) and their advantages and returns are 0.

    gamma = lam = 1 gives A_t = (sum of rewards from t on) - V_t; lam = 0 gives the one-step TD
    error; gamma = 0 gives r_t - V_t. Both outputs are detached: they are targets, not functions of
    the parameters. Computed (and returned) in the values' dtype, or float32 if that is narrower.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma (the discount) must be in [0, 1]; got {gamma}.")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam (GAE's lambda) must be in [0, 1]; got {lam}.")
    check_2d("values_BT", values_BT)
    check_same_shape("values_BT", values_BT, rewards_BT=rewards_BT, mask_BT=mask_BT)
    # At least float32: a bf16 recursion over thousands of tokens would drift.
    dtype = torch.promote_types(_float_dtype(values_BT), torch.float32)
    values_BT = values_BT.detach().to(dtype)
    valid_BT = as_float_mask(mask_BT, values_BT) > 0
    # `where`, not a product: a non-finite value at a masked position must not turn into NaN.
    zeros_BT = torch.zeros_like(values_BT)
    values_BT = torch.where(valid_BT, values_BT, zeros_BT)
    rewards_BT = torch.where(valid_BT, rewards_BT.detach().to(values_BT.dtype), zeros_BT)

    advantages_BT = torch.zeros_like(values_BT)
    next_value_B = values_BT.new_zeros(values_BT.shape[0])
    next_advantage_B = values_BT.new_zeros(values_BT.shape[0])
    for t in reversed(range(values_BT.shape[1])):
        valid_B = valid_BT[:, t]
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        advantage_B = delta_B + gamma * lam * next_advantage_B
        advantages_BT[:, t] = torch.where(valid_B, advantage_B, 0.0)
        # A masked token passes its successor's value and advantage through unchanged.
        next_value_B = torch.where(valid_B, values_BT[:, t], next_value_B)
        next_advantage_B = torch.where(valid_B, advantage_B, next_advantage_B)
    returns_BT = torch.where(valid_BT, advantages_BT + values_BT, zeros_BT)
    return advantages_BT, returns_BT


def moments(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(count, sum, sum of squares) of x over the valid tokens: float64 [3], detached.

    All-reduce it (SUM over the DP group) and pass the total to `whiten` as `moments_3`.
    """
    check_2d("x_BT", x_BT)
    check_same_shape("x_BT", x_BT, mask_BT=mask_BT)
    x_BT = x_BT.detach().to(torch.float64)
    valid_BT = as_float_mask(mask_BT, x_BT) > 0
    x_BT = torch.where(valid_BT, x_BT, torch.zeros_like(x_BT))
    return torch.stack([valid_BT.to(torch.float64).sum(), x_BT.sum(), x_BT.square().sum()])


def _as_sums(
    name: str, sums: torch.Tensor | list[float] | tuple[float, ...], n: int, device: torch.device | str
) -> torch.Tensor:
    sums_N = torch.as_tensor(sums, dtype=torch.float64, device=device).detach()
    if sums_N.shape != (n,):
        raise ValueError(
            f"{name} must hold exactly {n} numbers (flat [{n}]); got shape {tuple(sums_N.shape)}."
        )
    if sums_N[0] < 0:
        raise ValueError(f"{name}[0] is a token count and must be >= 0; got {sums_N[0].item()}.")
    return sums_N


def _mean_var(count: torch.Tensor, total: torch.Tensor, total_sq: torch.Tensor):
    """Mean and population variance from sums (clamped at 0: rounding can leave it slightly negative)."""
    n = count.clamp(min=1)
    mean = total / n
    return mean, (total_sq / n - mean.square()).clamp(min=0)


def whiten(
    x_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str,
    moments_3: torch.Tensor | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """x [B, T] normalised over the valid tokens; zero on masked positions.

        batch  (x - mean) / (std + eps)
        scale  x / (std + eps)           (the mean is kept: no shift, so signs are kept)
        none   x                         (valid tokens unchanged)

    mean and std (population, i.e. divided by the count) come from `moments_3`, the (count, sum,
    sum of squares) of `moments` summed over the DP ranks; without it, from this call's tokens. The
    statistics are constants: a gradient through x (if any) does not flow into them. The result has
    x's dtype.
    """
    if mode not in ADVANTAGE_WHITENING:
        raise ValueError(f"unknown whitening mode {mode!r}; choose one of {', '.join(ADVANTAGE_WHITENING)}.")
    if not eps > 0:
        raise ValueError(f"eps must be > 0 (it keeps a zero std from dividing by zero); got {eps}.")
    check_2d("x_BT", x_BT)
    check_same_shape("x_BT", x_BT, mask_BT=mask_BT)
    valid_BT = as_float_mask(mask_BT, x_BT) > 0
    if moments_3 is not None:
        moments_3 = _as_sums("moments_3 (count, sum, sum of squares)", moments_3, 3, x_BT.device)
    if mode == "none":
        return torch.where(valid_BT, x_BT, torch.zeros_like(x_BT))
    stats_3 = moments(x_BT, mask_BT) if moments_3 is None else moments_3
    mean, var = _mean_var(*stats_3)
    std = var.sqrt()
    shift = mean if mode == "batch" else torch.zeros_like(mean)
    whitened_BT = ((x_BT.to(torch.float64) - shift) / (std + eps)).to(x_BT.dtype)
    return torch.where(valid_BT, whitened_BT, torch.zeros_like(whitened_BT))


def explained_variance_sums(
    values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """(n, sum R, sum R^2, sum D, sum D^2) over the valid tokens, D = R - V: float64 [5], detached.

    All-reduce it (SUM over the DP group) and pass the total to `explained_variance_from`.
    """
    check_2d("values_BT", values_BT)
    check_same_shape("values_BT", values_BT, returns_BT=returns_BT, mask_BT=mask_BT)
    values_BT = values_BT.detach().to(torch.float64)
    returns_BT = returns_BT.detach().to(torch.float64)
    valid_BT = as_float_mask(mask_BT, values_BT) > 0
    zeros_BT = torch.zeros_like(values_BT)
    returns_BT = torch.where(valid_BT, returns_BT, zeros_BT)
    residual_BT = torch.where(valid_BT, returns_BT - values_BT, zeros_BT)
    return torch.stack(
        [
            valid_BT.to(torch.float64).sum(),
            returns_BT.sum(),
            returns_BT.square().sum(),
            residual_BT.sum(),
            residual_BT.square().sum(),
        ]
    )


def explained_variance_from(sums: torch.Tensor | list[float] | tuple[float, ...]) -> float:
    """1 - Var(R - V) / Var(R) (population variances) from the five sums of `explained_variance_sums`.

    1 is a perfect value function, 0 one no better than a constant, negative one worse than a
    constant. NaN when the returns do not vary (Var(R) = 0, up to the float64 rounding of the
    sums) or there are no tokens: the ratio is undefined then.
    """
    device = sums.device if torch.is_tensor(sums) else "cpu"
    count, total_r, total_r2, total_d, total_d2 = _as_sums(
        "sums (n, sum R, sum R^2, sum D, sum D^2)", sums, 5, device
    )
    if count <= 0:
        return float("nan")
    _, var_r = _mean_var(count, total_r, total_r2)
    _, var_d = _mean_var(count, total_d, total_d2)
    # The moment formula E[R^2] - E[R]^2 cancels to rounding noise (not exactly 0) for constant R.
    if var_r <= 1e-12 * (total_r2 / count):
        return float("nan")
    return float(1.0 - var_d / var_r)
