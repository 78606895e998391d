"""The named choices of the recipe schema, torch-free, defined once.

The modules that implement a choice (the reward modes, the refusal policies, the model families) import
their names from here, and the recipe check (megatron_rl/check/ranges.py) admits exactly these, so
`validate` cannot accept a name the code does not implement. The algorithms' own choices (KL estimators,
loss aggregations, where the old log-probs come from) are theirs: algorithms/names.py, which nothing
below the algorithms needs.
"""

from __future__ import annotations

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")
OVERLONG_MODES = ("none", "mask", "penalty")
REFERENCE_PLACEMENTS = ("resident", "offload")
REWARD_KINDS = ("sandbox", "function", "model", "http")
ALGORITHMS = ("grpo", "ppo")
ADVANTAGE_WHITENING = ("batch", "scale", "none")
REWARD_MODES = ("all_or_nothing", "fraction")
REFUSAL_POLICIES = ("stop", "skip", "retry")
# What a disagreement of the engines' and the trainer's log-probs does (rollout/agreement.py).
DISAGREEMENT_ACTIONS = ("refuse", "stop", "warn")
