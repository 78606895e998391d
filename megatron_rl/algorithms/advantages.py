"""Group-relative advantages (GRPO): each sample is scored against the other samples of its prompt.

With n samples per prompt, the group mean is the baseline, so no value network is needed. Dividing by
the group's standard deviation (GRPO) makes every prompt contribute a gradient of similar size, which
also up-weights prompts that are nearly always solved or nearly always failed; Dr.GRPO drops the
division to remove that difficulty bias (`std_norm=False`).

Shape suffixes:
    P = prompts (groups)
    N = samples per prompt (the group size n)
    G = all samples, flattened prompt-major: P * N, samples of prompt p at [p*N, (p+1)*N)
"""

import torch


def group_advantages(
    rewards_G: torch.Tensor, n: int, *, std_norm: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages [G] for rewards [G] laid out prompt-major in groups of `n`.

    advantage = reward - group mean, divided by (group std + eps) when `std_norm` (GRPO) and left
    unscaled when not (Dr.GRPO). The std is the sample (n - 1) standard deviation.

    A group whose rewards are all equal carries no learning signal (every sample is as good as its
    baseline), so its advantages are exactly zero; the explicit zero also avoids the tiny non-zero
    values that floating-point rounding of the mean would leave, which `std_norm` would then blow up
    by 1/eps.
    """
    if rewards_G.dim() != 1:
        raise ValueError(
            f"rewards_G must be flat [num_prompts * n]; got shape {tuple(rewards_G.shape)}. "
            "Flatten it prompt-major (samples of one prompt adjacent)."
        )
    if n < 2:
        raise ValueError(f"group size n must be >= 2 for group-relative advantages; got n={n}.")
    if rewards_G.numel() % n != 0:
        raise ValueError(
            f"rewards_G has {rewards_G.numel()} entries, not a multiple of the group size n={n}; "
            "every prompt needs exactly n samples."
        )
    if eps < 0:
        raise ValueError(f"eps must be >= 0; got {eps}.")
    rewards_PN = rewards_G.detach().float().reshape(-1, n)
    advantages_PN = rewards_PN - rewards_PN.mean(dim=-1, keepdim=True)
    if std_norm:
        advantages_PN = advantages_PN / (rewards_PN.std(dim=-1, keepdim=True) + eps)
    constant_P1 = (rewards_PN.amax(dim=-1) == rewards_PN.amin(dim=-1)).unsqueeze(-1)
    advantages_PN = torch.where(constant_P1, torch.zeros_like(advantages_PN), advantages_PN)
    return advantages_PN.reshape(-1)
