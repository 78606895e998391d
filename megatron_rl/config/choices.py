"""The named choices of the recipe schema, torch-free, defined once.

The modules that implement a choice (the KL estimators, the loss aggregations, the reward modes, the
refusal policies) import their names from here, and the recipe check (megatron_rl/check.py) admits
exactly these, so `validate` cannot accept a name the code does not implement.
"""

from __future__ import annotations

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
OVERLONG_MODES = ("none", "mask", "penalty")
REFERENCE_PLACEMENTS = ("resident", "offload")
REWARD_KINDS = ("sandbox", "function")
REWARD_MODES = ("all_or_nothing", "fraction")
REFUSAL_POLICIES = ("stop", "skip", "retry")
# What a disagreement of the engines' and the trainer's log-probs does (rollout/agreement.py).
DISAGREEMENT_ACTIONS = ("refuse", "stop", "warn")
# Where the ratio's denominator comes from (megatron_rl/loop/old_policy.py).
OLD_LOGPROBS = ("recompute", "engine", "auto")
