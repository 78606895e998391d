"""Over-long completions: ones the engine cut at the generation limit, before they finished.

A truncated completion's reward says little about its content (the tests of an unfinished program
fail whatever the code was), so training on it as an ordinary failure teaches "stop reasoning",
and length creeps toward the limit anyway. Two remedies (DAPO):
    overlong_mask     drop truncated samples from the loss (their tokens get mask 0);
    overlong_penalty  soft length shaping added to the reward: 0 up to max_len - buffer, then a
                      linear ramp down to -1 at max_len, -1 beyond.

Shape suffixes:
    B = sequences
    T = completion tokens per sequence (padded)
"""

import torch

from megatron_rl.algorithms._checks import check_2d


def overlong_mask(mask_BT: torch.Tensor, truncated_B: torch.Tensor) -> torch.Tensor:
    """`mask_BT` with every token of a truncated sample set to 0 (same dtype as `mask_BT`).

    `truncated_B` is True where the engine stopped the sample at its length limit (finish reason
    "length"), not where its length merely equals the limit: a sample may end with EOS exactly there.
    """
    check_2d("mask_BT", mask_BT)
    if truncated_B.shape != (mask_BT.shape[0],) or truncated_B.dtype != torch.bool:
        raise ValueError(
            f"truncated_B must be a bool tensor of shape ({mask_BT.shape[0]},), one flag per sequence; "
            f"got {truncated_B.dtype} {tuple(truncated_B.shape)}."
        )
    return torch.where(truncated_B.unsqueeze(-1), torch.zeros_like(mask_BT), mask_BT)


def overlong_penalty(lengths_B: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """Float [B] reward shaping for completion lengths (tokens):

    0                                    if L <= max_len - buffer
    (max_len - buffer - L) / buffer      if max_len - buffer < L <= max_len
    -1                                   if L > max_len
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0; got {max_len}.")
    if not 0 < buffer <= max_len:
        raise ValueError(
            f"buffer must be in (0, max_len={max_len}] (the tokens before the limit where the penalty "
            f"ramps); got {buffer}."
        )
    if lengths_B.dim() != 1:
        raise ValueError(
            f"lengths_B must be [B], one length per sequence; got shape {tuple(lengths_B.shape)}."
        )
    start = max_len - buffer
    ramp_B = (start - lengths_B.to(torch.float32)) / buffer
    return ramp_B.clamp(min=-1.0, max=0.0)
