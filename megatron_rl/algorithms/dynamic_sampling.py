"""Dynamic sampling (DAPO): keep only prompts whose samples disagree, and top the batch back up.

A group whose n rewards are all equal (all pass or all fail) has zero group-relative advantage for
every sample, so it adds no policy gradient while still costing trainer time and diluting the
token-mean denominator. Dropping such groups and drawing more prompts keeps every optimizer step
at full strength as the policy improves and more prompts become all-pass.

The loop owns the drawing; these functions only decide:
    keep_P = informative_groups(rewards_G, n)           which groups to keep
    more = fill_batch(kept, target, drawn, ...)         how many more prompts to draw (0 = stop)
    keep_P = trim_groups(keep_P, target)                drop the surplus once over the target

Shape suffixes:
    P = prompts (groups)
    N = samples per prompt (the group size n)
    G = all samples, flattened prompt-major: P * N
"""

import math

import torch


def informative_groups(rewards_G: torch.Tensor, n: int) -> torch.Tensor:
    """Bool [P]: True for groups whose rewards are not all equal.

    Expand to samples with `keep_P.repeat_interleave(n)`.
    """
    if rewards_G.dim() != 1:
        raise ValueError(f"rewards_G must be flat [num_prompts * n]; got shape {tuple(rewards_G.shape)}.")
    if n < 1 or rewards_G.numel() % n != 0:
        raise ValueError(
            f"rewards_G has {rewards_G.numel()} entries, not a multiple of the group size n={n}; "
            "every prompt needs exactly n samples."
        )
    rewards_PN = rewards_G.reshape(-1, n)
    return rewards_PN.amax(dim=-1) != rewards_PN.amin(dim=-1)


def fill_batch(
    kept_groups: int,
    target_groups: int,
    drawn_groups: int,
    *,
    resample_rounds_done: int,
    max_resample_rounds: int,
    max_draw: int | None = None,
) -> int:
    """How many more prompts to draw so that `target_groups` informative groups are likely reached.

    kept_groups: informative groups collected so far; drawn_groups: prompts drawn so far (all
    rounds); resample_rounds_done: extra rounds already drawn after the first batch.

    The keep rate is estimated from what has been drawn with add-one smoothing,
    (kept + 1) / (drawn + 2), so a round in which every group was uninformative still gives a
    finite, growing request instead of a division by zero. The request is at least 1 and at most
    `max_draw` (default: `target_groups`, i.e. never more than one full batch per round). Returns 0
    when the target is met or the resampling rounds are spent; the loop then trains on what it has
    (after `trim_groups`).
    """
    if target_groups <= 0:
        raise ValueError(f"target_groups must be > 0; got {target_groups}.")
    if min(kept_groups, drawn_groups, resample_rounds_done, max_resample_rounds) < 0:
        raise ValueError(
            "kept_groups, drawn_groups, resample_rounds_done and max_resample_rounds must be >= 0; got "
            f"{kept_groups}, {drawn_groups}, {resample_rounds_done}, {max_resample_rounds}."
        )
    if kept_groups > drawn_groups:
        raise ValueError(f"kept_groups ({kept_groups}) cannot exceed drawn_groups ({drawn_groups}).")
    cap = target_groups if max_draw is None else max_draw
    if cap <= 0:
        raise ValueError(f"max_draw must be > 0; got {max_draw}.")
    if drawn_groups == 0:
        return min(target_groups, cap)
    missing = target_groups - kept_groups
    if missing <= 0 or resample_rounds_done >= max_resample_rounds:
        return 0
    keep_rate = (kept_groups + 1) / (drawn_groups + 2)
    return max(1, min(cap, math.ceil(missing / keep_rate)))


def trim_groups(keep_P: torch.Tensor, target_groups: int) -> torch.Tensor:
    """Bool [P]: `keep_P` with only its first `target_groups` True entries left True.

    Keeping the earliest drawn groups (rather than a random subset) makes the batch a deterministic
    function of the draw order, which exact resume relies on.
    """
    if keep_P.dim() != 1 or keep_P.dtype != torch.bool:
        raise ValueError(f"keep_P must be a bool [P] tensor; got {keep_P.dtype} {tuple(keep_P.shape)}.")
    if target_groups < 0:
        raise ValueError(f"target_groups must be >= 0; got {target_groups}.")
    return keep_P & (keep_P.cumsum(dim=0) <= target_groups)
