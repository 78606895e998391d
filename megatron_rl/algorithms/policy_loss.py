"""PPO clipped surrogate with separate low/high clip ranges, and truncated importance weights.

Clip-higher (DAPO): a larger `clip_high` than `clip_low` lets the probability of a rare but good token
grow further within one batch, which keeps entropy from collapsing; the low side stays tight so bad
tokens are not pushed down too hard.

Truncated importance sampling: the rollout engine samples with its own numerics (another kernel,
precision or a stale policy version), so the behaviour policy differs from the trainer's "old"
policy. Weighting each token by min(pi_old / pi_rollout, cap) corrects for that mismatch while the
cap bounds the variance. The weights are constants of the loss (detached).

Shape suffixes:
    B = sequences in the (micro)batch
    T = completion tokens per sequence (padded; padded positions must hold finite values)
"""

import torch

from megatron_rl.algorithms._checks import as_float_mask, check_2d, check_same_shape, per_token


def truncated_is_weights(
    old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token weights min(exp(old - rollout), cap), detached, [B, T]."""
    if cap <= 0:
        raise ValueError(f"truncated IS cap must be > 0 (it bounds pi_old / pi_rollout); got {cap}.")
    check_same_shape("old_logprobs_BT", old_logprobs_BT, rollout_logprobs_BT=rollout_logprobs_BT)
    log_ratio_BT = (old_logprobs_BT - rollout_logprobs_BT).detach()
    return torch.exp(log_ratio_BT).clamp(max=cap)


def _masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.where(mask_BT > 0, values_BT, torch.zeros_like(values_BT)).sum() / count.clamp(min=1)


def clipped_surrogate(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    is_weights_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss [B, T] = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) [* w].

    r = exp(logprobs - old_logprobs) with old_logprobs detached, A = `advantages` ([B] broadcast over
    tokens, or [B, T]), w = optional truncated-IS weights. Masked positions are zero in the returned
    loss; reduce it with `aggregate_loss`.

    Where the clipped branch is the minimum (r above 1 + clip_high with A > 0, or below 1 - clip_low
    with A < 0) the token's gradient is zero: the update already moved that token far enough. On the
    other side (e.g. r small with A > 0) the gradient still flows, which is what lets PPO undo a step
    that went the wrong way.

    Metrics (detached scalars over valid tokens of this call): clip_fraction (either side),
    clip_low_fraction, clip_high_fraction, ratio_mean, ratio_max, and is_weight_mean when weights
    are given. With no valid tokens they are zero.
    """
    if not 0 <= clip_low < 1:
        raise ValueError(f"clip_low must be in [0, 1) so that 1 - clip_low > 0; got {clip_low}.")
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0; got {clip_high}.")
    check_2d("logprobs_BT", logprobs_BT)
    check_same_shape(
        "logprobs_BT",
        logprobs_BT,
        old_logprobs_BT=old_logprobs_BT,
        mask_BT=mask_BT,
        is_weights_BT=is_weights_BT,
    )
    advantages_BT = per_token("advantages", advantages, logprobs_BT).detach().to(logprobs_BT.dtype)
    maskf_BT = as_float_mask(mask_BT, logprobs_BT)

    ratio_BT = torch.exp(logprobs_BT - old_logprobs_BT.detach())
    clipped_ratio_BT = ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_BT = torch.maximum(-ratio_BT * advantages_BT, -clipped_ratio_BT * advantages_BT)
    if is_weights_BT is not None:
        loss_BT = loss_BT * is_weights_BT.detach()
    # `where`, not a product: a non-finite value at a padded position must not turn into NaN.
    loss_BT = torch.where(maskf_BT > 0, loss_BT, torch.zeros_like(loss_BT))

    with torch.no_grad():
        count = maskf_BT.sum()
        # A token counts as clipped only when the clip removed its gradient (the side that binds).
        clipped_low_BT = (ratio_BT < 1.0 - clip_low) & (advantages_BT < 0)
        clipped_high_BT = (ratio_BT > 1.0 + clip_high) & (advantages_BT > 0)
        valid_BT = maskf_BT > 0
        metrics = {
            "clip_fraction": _masked_mean(
                (clipped_low_BT | clipped_high_BT).to(maskf_BT.dtype), maskf_BT, count
            ),
            "clip_low_fraction": _masked_mean(clipped_low_BT.to(maskf_BT.dtype), maskf_BT, count),
            "clip_high_fraction": _masked_mean(clipped_high_BT.to(maskf_BT.dtype), maskf_BT, count),
            "ratio_mean": _masked_mean(ratio_BT, maskf_BT, count),
            "ratio_max": torch.where(valid_BT, ratio_BT, torch.zeros_like(ratio_BT)).amax()
            if ratio_BT.numel() > 0
            else ratio_BT.new_zeros(()),
        }
        if is_weights_BT is not None:
            metrics["is_weight_mean"] = _masked_mean(is_weights_BT, maskf_BT, count)
    return loss_BT, metrics
