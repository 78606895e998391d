"""The choices the algorithms implement, by the names recipes use: defined here, with the algorithms
(torch-free, so the recipe check that admits exactly these needs no torch)."""

from __future__ import annotations

KL_ESTIMATORS = ("k1", "k2", "k3")  # kl.py
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")  # aggregation.py
OLD_LOGPROBS = ("recompute", "engine", "auto")  # old_policy.py: where the ratio's denominator comes from
