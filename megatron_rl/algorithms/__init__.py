"""The RL algorithms as pure functions of tensors.

Everything here takes tensors and plain numbers and returns tensors: no process groups, no config
objects, no model. That keeps the mathematics testable by hand on a laptop and lets the trainer
decide where data lives and how ranks reduce. One idea per module:

    advantages         group_advantages        group-relative advantages (GRPO, Dr.GRPO)
    policy_loss        clipped_surrogate       PPO clip with separate low/high ranges (clip-higher)
                       truncated_is_weights    capped importance weights against the rollout policy
    kl                 kl_estimate             k1/k2/k3 estimates of KL to the reference
                       kl_penalty_rewards      KL folded into the rewards instead of the loss
    aggregation        aggregate_loss          token-mean / seq-mean-token-mean / seq-mean-token-sum-norm,
                       loss_normalizer         with the global denominator data parallelism needs
    dynamic_sampling   informative_groups      drop groups whose rewards are all equal (DAPO)
                       fill_batch, trim_groups how many prompts to draw to keep the batch full
    overlong           overlong_mask           drop truncated samples from the loss
                       overlong_penalty        soft length penalty near the generation limit
    grpo               grpo_loss               the composition the trainer calls
"""

from megatron_rl.algorithms.advantages import group_advantages
from megatron_rl.algorithms.aggregation import LOSS_AGGREGATIONS, aggregate_loss, loss_normalizer
from megatron_rl.algorithms.dynamic_sampling import fill_batch, informative_groups, trim_groups
from megatron_rl.algorithms.grpo import grpo_loss
from megatron_rl.algorithms.kl import KL_ESTIMATORS, kl_estimate, kl_penalty_rewards
from megatron_rl.algorithms.overlong import overlong_mask, overlong_penalty
from megatron_rl.algorithms.policy_loss import clipped_surrogate, truncated_is_weights

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "aggregate_loss",
    "clipped_surrogate",
    "fill_batch",
    "group_advantages",
    "grpo_loss",
    "informative_groups",
    "kl_estimate",
    "kl_penalty_rewards",
    "loss_normalizer",
    "overlong_mask",
    "overlong_penalty",
    "trim_groups",
    "truncated_is_weights",
]
