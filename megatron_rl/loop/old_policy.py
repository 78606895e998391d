"""Where the clipped ratio's denominator, the old policy's log-probs, comes from.

`algorithm.old_logprobs` chooses:
- `recompute`: a trainer forward over the step's samples before the first update. Costs one forward
  pass per step (the planner counts it); gives the agreement check every sample.
- `auto` (default): skip that forward when the batch is exactly on-policy, else recompute. Exactly
  on-policy means one minibatch (the only update's own forward runs on the weights the samples were
  drawn with, so its log-probs, detached, *are* the old log-probs: ratio 1, the clip inactive) and
  every sample drawn with the version the trainer holds (a refused publication leaves an older one
  serving: recompute then). KL folded into the rewards needs the old log-probs before the
  advantages: recompute.
- `engine`: the engines' own sampling log-probs, returned with every token, at any minibatch count:
  the ratio is taken against the behaviour policy itself. Its agreement with the trainer is still
  measured every step, on the first minibatch's samples, from that minibatch's update forward (it
  runs before any update, on the weights the samples were drawn with).

Without the recompute forward, the agreement check (rollout/logprob_check.py) compares the engine's
log-probs with those of the update's first forward, so a wrong weight mapping or a stale engine
still shows in every step record.
"""

from __future__ import annotations

from collections.abc import Iterable

from megatron_rl.config.choices import OLD_LOGPROBS

RECOMPUTE = "recompute"  # a trainer forward before the first update
UPDATE = "update_forward"  # the first (only) minibatch's own forward, detached
ENGINE = "engine"  # the engines' sampling log-probs


def planned_source(mode: str, minibatches: int, kl_in_reward: bool) -> str:
    """The source a recipe plans for when every publication lands (what the planner counts)."""
    if mode not in OLD_LOGPROBS:
        raise ValueError(f"algorithm.old_logprobs={mode!r}: use one of {', '.join(OLD_LOGPROBS)}")
    if mode == "engine":
        return ENGINE
    if mode == "auto" and minibatches == 1 and not kl_in_reward:
        return UPDATE
    return RECOMPUTE


def step_source(
    mode: str,
    minibatches: int,
    kl_in_reward: bool,
    sample_versions: Iterable[int],
    trainer_version: int | None,
) -> str:
    """This step's source: the planned one, unless the samples were not drawn with the weights the
    trainer holds (`trainer_version`: the version just published and activated, None when refused),
    in which case the update's forward is not the old policy's and `auto` recomputes."""
    planned = planned_source(mode, minibatches, kl_in_reward)
    if planned == UPDATE and (trainer_version is None or set(sample_versions) != {trainer_version}):
        return RECOMPUTE
    return planned


def needs_forward(mode: str, minibatches: int, kl_in_reward: bool) -> bool:
    """Whether a recipe spends a trainer forward on old log-probs (the planner's count)."""
    return planned_source(mode, minibatches, kl_in_reward) == RECOMPUTE
