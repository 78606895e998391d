"""The long tail of completion lengths: the cap, the truncated flag, and what the loss does with it.

The engine caps each sample at min(rollout.max_new_tokens, room left under max_model_len) and marks
a sample cut there `truncated` (finish reason "length"). A truncated sample's reward says little
about its content, so the algorithm chooses (algorithm.overlong):
    none     train on it as it is;
    mask     drop its tokens from the loss (algorithms.overlong.overlong_mask);
    penalty  add a soft length penalty to the reward over the last `overlong_penalty_tokens` tokens
             before the cap (algorithms.overlong.overlong_penalty).

Legend: B = samples, T = completion tokens (padded).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from megatron_rl.algorithms.overlong import overlong_mask, overlong_penalty
from megatron_rl.rollout.types import Sample

OVERLONG_MODES = ("none", "mask", "penalty")


def lengths_and_truncation(samples: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths_B int64, truncated_B bool) in the order of `samples`."""
    lengths_B = torch.tensor([len(s.token_ids) for s in samples], dtype=torch.long)
    truncated_B = torch.tensor([s.truncated for s in samples], dtype=torch.bool)
    return lengths_B, truncated_B


def apply_overlong(
    samples: Sequence[Sample],
    rewards_B: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str,
    max_new_tokens: int,
    penalty_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards_B, mask_BT) after the chosen over-long handling (see module docstring)."""
    if mode not in OVERLONG_MODES:
        raise ValueError(f"algorithm.overlong must be one of {OVERLONG_MODES}; got {mode!r}")
    if rewards_B.shape != (len(samples),):
        raise ValueError(f"rewards_B has shape {tuple(rewards_B.shape)}; expected ({len(samples)},)")
    lengths_B, truncated_B = lengths_and_truncation(samples)
    if mode == "mask":
        return rewards_B, overlong_mask(mask_BT, truncated_B)
    if mode == "penalty":
        if penalty_tokens <= 0:
            raise ValueError(
                "algorithm.overlong=penalty needs algorithm.overlong_penalty_tokens > 0 (the ramp before the cap)"
            )
        return rewards_B + overlong_penalty(lengths_B, max_new_tokens, penalty_tokens).to(
            rewards_B.dtype
        ), mask_BT
    return rewards_B, mask_BT


def length_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """Completion lengths (mean, p50, p99, max) and the truncated fraction, for the step record."""
    if not samples:
        raise ValueError("no samples")
    lengths_B, truncated_B = lengths_and_truncation(samples)
    x = lengths_B.double()
    return dict(
        length_mean=float(x.mean()),
        length_p50=float(torch.quantile(x, 0.5)),
        length_p99=float(torch.quantile(x, 0.99)),
        length_max=float(x.max()),
        truncated_fraction=float(truncated_B.double().mean()),
    )
