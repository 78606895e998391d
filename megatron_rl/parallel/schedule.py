"""The order in which a separated job's two pools meet: publications and batches, sync or async.

Both pools walk the same sequence of meetings on the job group (loop/placement/pools.py), so every collective is
matched without any further handshake. With staleness k (0 = synchronous; `rollout.max_staleness` when
`layout.synchrony=async`), starting at step `start`:

    step s = start:   publish P(s+1); batches B(s) .. B(s+k-1)       (the first k batches: no overlap)
    every step s:     [k = 0: batch B(s)]   train s   [k >= 1: batch B(s+k)]
    step s+1:         publish P(s+2) ... (only while a later batch will use it)

P(v) is the policy after v - 1 updates; the engines sample B(t) with the newest version they hold,
max(start + 1, t + 1 - k), so the trainer, which trains B(t) at version t + 1, sees a lag of at most
k. While the trainer trains step s the engines generate B(s+k): that is the overlap. A publication lands
between two of the engines' batches, never inside one, so every sample of a batch has one version.
"""

from __future__ import annotations


def staleness(layout, rollout) -> int:
    """k: how many steps the engines may run ahead (0 unless separated and asynchronous)."""
    if layout.placement == "separated" and layout.synchrony == "async":
        return int(rollout.max_staleness)
    return 0


def defers_scoring(algorithm, rollout, k: int) -> bool:
    """Whether a batch B(t) is handed over before its rewards, which follow once the trainer's forwards
    that need none (reference and old log-probs, a reward model's, a critic's) have run
    (loop/step/collect.py PendingRewards): synchronous runs only (k >= 1: the scoring already hides behind
    the training); not with dynamic sampling, which chooses groups by their rewards, nor with partial
    rollouts or multi-turn environments, whose samples are carried scored or come scored."""
    return k == 0 and not (algorithm.dynamic_sampling or rollout.partial or rollout.env)


def publish_due(step: int, start: int, k: int, steps: int) -> bool:
    """Whether step `step` opens with a publication: always the first step, and later ones only while
    a batch still to be drawn (B(step + k)) will be sampled with it."""
    return step == start or step + k < steps


def batches_before_train(step: int, start: int, k: int, steps: int) -> list[int]:
    """The batches drawn after the publication and before the trainer trains `step`."""
    if k == 0:
        return [step]
    return list(range(start, min(start + k, steps))) if step == start else []


def batches_after_train(step: int, k: int, steps: int) -> list[int]:
    """The batch drawn while `step` trains (async): B(step + k), if the run reaches it."""
    return [step + k] if k > 0 and step + k < steps else []


def sampling_version(batch: int, start: int, k: int) -> int:
    """The version the engines hold when they draw `batch` (P(v) = the policy after v - 1 updates)."""
    return max(start + 1, batch + 1 - k)
