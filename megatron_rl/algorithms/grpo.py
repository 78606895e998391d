"""The GRPO loss of one (micro)batch: clipped surrogate + KL to the reference, aggregated.

    loss = aggregate( w * -min(r A, clip(r) A) + kl_coef * k(logp, logp_ref) )

with r = pi / pi_old per token, A the sequence's group-relative advantage, w the optional truncated
importance weight against the rollout policy, k a KL estimator. Every piece lives in its own
module; this one only wires them together from plain arguments, so the trainer passes config
values and tensors and gets back one differentiable scalar plus detached metrics.

Shape suffixes:
    B = sequences in the (micro)batch
    T = completion tokens per sequence (padded)
"""

import torch

from megatron_rl.algorithms._checks import as_float_mask
from megatron_rl.algorithms.aggregation import aggregate_loss
from megatron_rl.algorithms.kl import kl_estimate
from megatron_rl.algorithms.policy_loss import clipped_surrogate, truncated_is_weights


def grpo_loss(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    loss_agg: str = "token-mean",
    max_len: int | None = None,
    rollout_logprobs_BT: torch.Tensor | None = None,
    truncated_is_cap: float = 0.0,
    global_tokens: float | torch.Tensor | None = None,
    global_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss scalar, metrics) for one (micro)batch.

    advantages: [B] (broadcast over tokens) or [B, T]. kl_coef > 0 needs `ref_logprobs_BT`; with
    kl_coef == 0 and reference log-probs given, the KL is still measured (metric only).
    truncated_is_cap > 0 needs `rollout_logprobs_BT` and weights each token's surrogate by
    min(pi_old / pi_rollout, cap). `max_len`, `global_tokens`, `global_seqs`: see `aggregate_loss`.

    Metrics (detached scalars, over this call's valid tokens; no entropy, which needs full logits):
    pg_loss (the surrogate part of the loss), kl (mean per-token estimate, when reference log-probs
    are given), clip_fraction, clip_low_fraction, clip_high_fraction, ratio_mean, ratio_max,
    is_weight_mean (with truncated IS), tokens (the local valid-token count, to weight metrics
    when averaging over ranks).
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0; got {kl_coef}.")
    if kl_coef > 0 and ref_logprobs_BT is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs_BT (log-probs of the frozen reference model).")
    if truncated_is_cap < 0:
        raise ValueError(f"truncated_is_cap must be >= 0 (0 = off); got {truncated_is_cap}.")
    if truncated_is_cap > 0 and rollout_logprobs_BT is None:
        raise ValueError("truncated_is_cap > 0 needs rollout_logprobs_BT (the engine's sampling log-probs).")

    is_weights_BT = None
    if truncated_is_cap > 0:
        is_weights_BT = truncated_is_weights(old_logprobs_BT, rollout_logprobs_BT, truncated_is_cap)
    pg_loss_BT, metrics = clipped_surrogate(
        logprobs_BT,
        old_logprobs_BT,
        advantages,
        mask_BT,
        clip_low=clip_low,
        clip_high=clip_high,
        is_weights_BT=is_weights_BT,
    )
    aggregate = dict(mode=loss_agg, max_len=max_len, global_tokens=global_tokens, global_seqs=global_seqs)
    pg_loss = aggregate_loss(pg_loss_BT, mask_BT, **aggregate)
    loss = pg_loss
    maskf_BT = as_float_mask(mask_BT, logprobs_BT)
    tokens = maskf_BT.sum().detach()
    metrics["pg_loss"] = pg_loss.detach()
    metrics["tokens"] = tokens
    if ref_logprobs_BT is not None:
        kl_BT = kl_estimate(logprobs_BT, ref_logprobs_BT, kl_estimator)
        metrics["kl"] = (torch.where(maskf_BT > 0, kl_BT, 0.0).sum() / tokens.clamp(min=1)).detach()
        if kl_coef > 0:
            loss = loss + kl_coef * aggregate_loss(kl_BT, mask_BT, **aggregate)
    return loss, metrics
