"""Reduce a per-token loss [B, T] to the scalar that is differentiated.

Three ways to weigh tokens against sequences:
    token-mean               sum over all valid tokens / number of valid tokens. Every token weighs
                             the same, so long completions count in proportion to their length
                             (DAPO's choice).
    seq-mean-token-mean      mean over each sequence's valid tokens, then mean over sequences. Every
                             sequence weighs the same, so a token of a long completion weighs less
                             (the original GRPO; this is Dr.GRPO's "length bias").
    seq-mean-token-sum-norm  sum over each sequence's valid tokens / a constant `max_len`, then mean
                             over sequences (Dr.GRPO): every token weighs the same and the scale does
                             not depend on the batch's lengths.
A sequence with no valid token (e.g. masked because it was truncated) is not counted in the
sequence modes' denominators, just as its tokens are not counted in token-mean.

Data parallelism and gradient accumulation. Each DP rank (and each micro-batch) sees only part of
the minibatch, and a mean over the local part is not a part of the global mean: local token counts
differ. Pass the minibatch-wide denominator instead: compute `loss_normalizer(mask_BT, mode)` for
every micro-batch on every rank, sum them (all-reduce SUM over the DP group, plus over the
micro-batches of the step), and give the total as `global_tokens` (token-mean) or `global_seqs`
(the sequence modes). Then the local losses add up to exactly the single-process loss of the whole
minibatch, and so do their gradients, provided the gradients are *summed*: megatron-core's DDP
averages over DP ranks (and its schedule averages over micro-batches) unless the model config has
`calculate_per_token_loss=True`; otherwise multiply each local loss by (dp_size * num_microbatches).

Shape suffixes:
    B = sequences in the (micro)batch
    T = completion tokens per sequence (padded)
"""

import torch

from megatron_rl.algorithms._checks import as_float_mask, check_2d, check_same_shape
from megatron_rl.algorithms.names import LOSS_AGGREGATIONS


def _check_mode(mode: str) -> None:
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}.")


def loss_normalizer(mask_BT: torch.Tensor, mode: str) -> torch.Tensor:
    """The local denominator of `mode` as a float scalar: valid tokens (token-mean) or sequences
    with at least one valid token (the sequence modes). Sum it over DP ranks and micro-batches to
    get `global_tokens` / `global_seqs`."""
    _check_mode(mode)
    check_2d("mask_BT", mask_BT)
    maskf_BT = as_float_mask(mask_BT, torch.empty((), dtype=torch.float32, device=mask_BT.device))
    if mode == "token-mean":
        return maskf_BT.sum()
    return (maskf_BT.sum(dim=-1) > 0).to(torch.float32).sum()


def _as_normalizer(value: float | torch.Tensor, name: str, like: torch.Tensor) -> torch.Tensor:
    normalizer = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if normalizer.dim() != 0:
        raise ValueError(f"{name} must be a scalar; got shape {tuple(normalizer.shape)}.")
    if not torch.is_tensor(value) and value < 0:
        raise ValueError(f"{name} must be >= 0 (a count summed over ranks); got {value}.")
    return normalizer


def aggregate_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str = "token-mean",
    *,
    max_len: int | None = None,
    global_tokens: float | torch.Tensor | None = None,
    global_seqs: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Scalar loss from a per-token loss [B, T] under `mode` (see the module docstring).

    `max_len` is the constant divisor of seq-mean-token-sum-norm (use the generation limit, e.g.
    max_new_tokens). `global_tokens` / `global_seqs` replace the local denominator (see the module
    docstring on data parallelism); give the one that matches `mode`. A denominator of zero (no
    valid token anywhere) gives a zero loss that still carries the graph, so every rank can call
    backward.
    """
    _check_mode(mode)
    check_2d("loss_BT", loss_BT)
    check_same_shape("loss_BT", loss_BT, mask_BT=mask_BT)
    if mode == "token-mean" and global_seqs is not None:
        raise ValueError("token-mean divides by tokens: pass global_tokens, not global_seqs.")
    if mode != "token-mean" and global_tokens is not None:
        raise ValueError(f"{mode} divides by sequences: pass global_seqs, not global_tokens.")
    if mode == "seq-mean-token-sum-norm" and (max_len is None or max_len <= 0):
        raise ValueError(
            f"seq-mean-token-sum-norm needs max_len > 0 (the generation limit); got max_len={max_len}."
        )
    maskf_BT = as_float_mask(mask_BT, loss_BT)
    masked_BT = torch.where(maskf_BT > 0, loss_BT, torch.zeros_like(loss_BT))

    if mode == "token-mean":
        if global_tokens is None:
            denominator = maskf_BT.sum()
        else:
            denominator = _as_normalizer(global_tokens, "global_tokens", loss_BT)
        return masked_BT.sum() / denominator.clamp(min=1)

    tokens_B = maskf_BT.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq_B = masked_BT.sum(dim=-1) / tokens_B.clamp(min=1)
    else:
        per_seq_B = masked_BT.sum(dim=-1) / max_len
    if global_seqs is None:
        denominator = (tokens_B > 0).to(loss_BT.dtype).sum()
    else:
        denominator = _as_normalizer(global_seqs, "global_seqs", loss_BT)
    return per_seq_B.sum() / denominator.clamp(min=1)
