"""PPO's value (critic) loss: squared error to the GAE returns, clipped around the old values.

    loss_t = 0.5 * max( (v_t - R_t)^2, (v_clipped_t - R_t)^2 ),  v_clipped = v_old + clip(v - v_old, +-c)

The clipped term keeps one batch from moving the value of a token more than `clip` away from the
value it had when the returns were computed (the same trust-region idea as the policy's ratio clip).
Taking the max (pessimistic, as in the PPO reference implementations) means that once v has moved
past the clip range in the direction that reduces the error, the clipped term is the larger one and
is constant in v, so the token's gradient is zero; moving back is never blocked. `clip` = 0 turns
the clipping off: 0.5 * (v - R)^2.

The old values and the returns are targets (detached); only `values_BT` is differentiated. The
per-token loss is reduced with `aggregation.aggregate_loss`, so the value loss takes the same
aggregation modes and the same global denominators under data parallelism as the policy loss.

Shape suffixes:
    B = sequences in the (micro)batch
    T = completion tokens per sequence (padded; padded positions may hold anything, NaN included)
"""

import torch

from megatron_rl.algorithms._checks import as_float_mask, check_2d, check_same_shape
from megatron_rl.algorithms.aggregation import aggregate_loss


def _masked_mean(values_BT: torch.Tensor, valid_BT: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.where(valid_BT, values_BT, torch.zeros_like(values_BT)).sum() / count.clamp(min=1)


def clipped_value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss [B, T] = 0.5 * max((v - R)^2, (v_clipped - R)^2), zero on masked positions.

    v_clipped = old + clamp(v - old, -clip, clip); `clip` = 0 means unclipped, 0.5 * (v - R)^2.
    Reduce the result with `aggregate_loss` (or call `value_loss`).

    Metrics (detached scalars over this call's valid tokens; zero without valid tokens):
    value_clip_fraction (share of tokens where the clipped term is strictly the larger, i.e. whose
    gradient the clip removed), value_mean (mean of v), tokens (the valid-token count).
    """
    if not clip >= 0:
        raise ValueError(f"value clip must be >= 0 (0 = unclipped); got {clip}.")
    check_2d("values_BT", values_BT)
    check_same_shape(
        "values_BT", values_BT, old_values_BT=old_values_BT, returns_BT=returns_BT, mask_BT=mask_BT
    )
    valid_BT = as_float_mask(mask_BT, values_BT) > 0
    # Masked positions are zeroed before any arithmetic, not only after: a NaN there would otherwise
    # come back through the backward pass (0 * NaN) even though its loss is masked out.
    zeros_BT = torch.zeros_like(values_BT.detach())
    values_BT = torch.where(valid_BT, values_BT, zeros_BT)
    old_values_BT = torch.where(valid_BT, old_values_BT.detach().to(values_BT.dtype), zeros_BT)
    returns_BT = torch.where(valid_BT, returns_BT.detach().to(values_BT.dtype), zeros_BT)

    unclipped_BT = (values_BT - returns_BT).square()
    if clip > 0:
        clipped_values_BT = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
        clipped_BT = (clipped_values_BT - returns_BT).square()
        loss_BT = 0.5 * torch.maximum(unclipped_BT, clipped_BT)
    else:
        clipped_BT = None
        loss_BT = 0.5 * unclipped_BT
    loss_BT = torch.where(valid_BT, loss_BT, torch.zeros_like(loss_BT))

    with torch.no_grad():
        count = valid_BT.to(values_BT.dtype).sum()
        if clipped_BT is None:
            clip_fraction = values_BT.new_zeros(())
        else:
            clip_fraction = _masked_mean((clipped_BT > unclipped_BT).to(values_BT.dtype), valid_BT, count)
        metrics = {
            "value_clip_fraction": clip_fraction,
            "value_mean": _masked_mean(values_BT, valid_BT, count),
            "tokens": count,
        }
    return loss_BT, metrics


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip: float = 0.2,
    loss_agg: str = "token-mean",
    max_len: int | None = None,
    global_tokens: float | torch.Tensor | None = None,
    global_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss scalar, metrics) of the clipped value loss for one (micro)batch.

    `loss_agg`, `max_len`, `global_tokens`, `global_seqs`: see `aggregate_loss` (the same ones the
    policy loss takes). Metrics (detached scalars): value_loss (the aggregated loss),
    value_clip_fraction, value_mean, tokens (see `clipped_value_loss`).
    """
    loss_BT, metrics = clipped_value_loss(values_BT, old_values_BT, returns_BT, mask_BT, clip)
    loss = aggregate_loss(
        loss_BT, mask_BT, loss_agg, max_len=max_len, global_tokens=global_tokens, global_seqs=global_seqs
    )
    metrics["value_loss"] = loss.detach()
    return loss, metrics
