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
    gae                token_rewards           PPO: the reward on the last token, KL on every token
                       gae_advantages          generalised advantage estimation; masked tokens skipped
                       moments, whiten         advantage whitening with DP-wide (all-reduced) moments
                       explained_variance_sums the value function's explained variance, from sums
                       explained_variance_from a caller all-reduces
    value              clipped_value_loss      PPO's critic loss, clipped around the old values
                       value_loss              the same, aggregated like the policy loss
    old_policy         source                  where the ratio's denominator comes from (no torch)
    names              KL_ESTIMATORS, ...      the choices these implement, torch-free: the recipe
                                               check admits exactly these

The functions load on first use (PEP 562): `megatron_rl.algorithms.names` and `.old_policy` import
without torch, so the recipe check and the planner stay torch-free.

No function is named after its module: importing a submodule binds the module to the package attribute of
its name, which would then shadow a function of that name.
"""

from importlib import import_module

_WHERE = {
    "group_advantages": "advantages",
    "aggregate_loss": "aggregation",
    "loss_normalizer": "aggregation",
    "fill_batch": "dynamic_sampling",
    "informative_groups": "dynamic_sampling",
    "trim_groups": "dynamic_sampling",
    "explained_variance_from": "gae",
    "explained_variance_sums": "gae",
    "gae_advantages": "gae",
    "moments": "gae",
    "token_rewards": "gae",
    "whiten": "gae",
    "grpo_loss": "grpo",
    "kl_estimate": "kl",
    "kl_penalty_rewards": "kl",
    "overlong_mask": "overlong",
    "overlong_penalty": "overlong",
    "clipped_surrogate": "policy_loss",
    "truncated_is_weights": "policy_loss",
    "clipped_value_loss": "value",
    "value_loss": "value",
    "KL_ESTIMATORS": "names",
    "LOSS_AGGREGATIONS": "names",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
