"""KL divergence to the frozen reference policy, estimated per token from sampled tokens only.

Only the log-probs of the sampled tokens are at hand (not full distributions), so KL(pi || pi_ref) is
estimated from samples of pi with Schulman's estimators ("Approximating KL Divergence", 2020), with
d = logp - logp_ref:
    k1 = d                         unbiased, high variance, can be negative
    k2 = d^2 / 2                   biased, low variance, always >= 0
    k3 = exp(-d) - (-d) - 1        unbiased, low variance, always >= 0 (the usual GRPO choice)

It enters training in one of two ways:
    - as a loss term, kl_coef * aggregate(k) (the gradient flows through logp), or
    - as a reward penalty (`kl_penalty_rewards`), a constant subtracted from the reward before
      advantages are computed (no gradient through it).

Shape suffixes:
    B = sequences
    T = completion tokens per sequence (padded)
"""

import torch

from megatron_rl.algorithms._checks import as_float_mask, check_2d, check_same_shape
from megatron_rl.algorithms.names import KL_ESTIMATORS


def kl_estimate(
    logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimate [B, T] (any matching shape) of KL(pi || pi_ref); differentiable in logprobs.

    The reference log-probs come from a frozen model and are detached.
    """
    check_same_shape("logprobs_BT", logprobs_BT, ref_logprobs_BT=ref_logprobs_BT)
    log_ratio_BT = logprobs_BT - ref_logprobs_BT.detach()
    if estimator == "k1":
        return log_ratio_BT
    if estimator == "k2":
        return 0.5 * log_ratio_BT.square()
    if estimator == "k3":
        # Written in terms of d = logp_ref - logp: exp(d) - d - 1.
        ref_minus_logp_BT = -log_ratio_BT
        return torch.exp(ref_minus_logp_BT) - ref_minus_logp_BT - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}.")


def kl_penalty_rewards(
    rewards_B: torch.Tensor,
    kl_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    kl_coef: float,
    *,
    per_token: bool = False,
) -> torch.Tensor:
    """Fold a KL penalty into the rewards; the KL is detached (rewards are not differentiated).

    per_token=False -> [B]: reward - kl_coef * sum of KL over the sequence's valid tokens. This is
        the form group advantages take (one scalar per sample).
    per_token=True  -> [B, T]: -kl_coef * KL at every valid token, plus the sequence reward at its
        last valid token (zero elsewhere), for estimators that use per-token returns. Summed over
        tokens it equals the per_token=False result; a sequence with no valid tokens gets all zeros.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0 (it scales a penalty); got {kl_coef}.")
    check_2d("kl_BT", kl_BT)
    check_same_shape("kl_BT", kl_BT, mask_BT=mask_BT)
    if rewards_B.shape != (kl_BT.shape[0],):
        raise ValueError(
            f"rewards_B has shape {tuple(rewards_B.shape)}; expected ({kl_BT.shape[0]},), one reward "
            "per sequence of kl_BT."
        )
    kl_BT = kl_BT.detach()
    maskf_BT = as_float_mask(mask_BT, kl_BT)
    penalty_BT = torch.where(maskf_BT > 0, -kl_coef * kl_BT, torch.zeros_like(kl_BT))
    rewards_B = rewards_B.detach().to(kl_BT.dtype)
    if not per_token:
        return rewards_B + penalty_BT.sum(dim=-1)
    num_valid_B = maskf_BT.sum(dim=-1)
    # Index of the last valid token: the largest position where the mask is set.
    positions_BT = torch.arange(kl_BT.shape[-1], device=kl_BT.device).expand_as(kl_BT)
    last_B = torch.where(maskf_BT > 0, positions_BT, -1).amax(dim=-1).clamp(min=0)
    reward_at_last_B = torch.where(num_valid_B > 0, rewards_B, torch.zeros_like(rewards_B))
    return penalty_BT.scatter_add(-1, last_B.unsqueeze(-1), reward_at_last_B.unsqueeze(-1))
