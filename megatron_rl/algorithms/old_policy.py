"""Where the clipped ratio's denominator, the old policy's log-probs, comes from.

The old log-probs a recompute gives are those of the trainer's weights before the step's first
update. `algorithm.old_logprobs` chooses:
- `recompute`: that forward, over the step's samples. One forward pass per step (the planner counts
  it); the agreement check sees every sample.
- `auto` (default): skip it whenever it would return exactly what the update computes anyway. With one
  minibatch the only update's own forward runs on those very weights, so its log-probs, detached, are
  the old log-probs (ratio 1, the clip inactive): the same gradient, one forward fewer. With several
  minibatches the later ones follow an update, and KL folded into the rewards needs the values before
  the advantages: recompute then. Samples drawn with an older version (a refused publication, or
  asynchrony) change nothing here: a recompute, too, scores them with the trainer's current weights;
  the engines' own log-probs (`engine`, or `algorithm.truncated_is_cap`) are what carry the behaviour
  policy.
- `engine`: the engines' sampling log-probs, returned with every token, at any minibatch count: the
  ratio is taken against the behaviour policy itself (in the engines' convention, rollout/convention.py).

Without the recompute, the agreement check (rollout/logprob_check.py) compares the engines' log-probs
with those of the first minibatch's own forward, taken before any update, so a wrong weight mapping or
a stale engine still shows in every step record.
"""

from __future__ import annotations

from megatron_rl.algorithms.names import OLD_LOGPROBS

RECOMPUTE = "recompute"  # a trainer forward before the first update
UPDATE = "update_forward"  # the first (only) minibatch's own forward, detached
ENGINE = "engine"  # the engines' sampling log-probs


def source(mode: str, minibatches: int, kl_in_reward: bool, kl_coef: float, epochs: int = 1) -> str:
    """Where a recipe's old log-probs come from; the driver and the planner both ask here. A second pass
    over the minibatches (`algorithm.epochs`) follows updates, as a second minibatch does."""
    if mode not in OLD_LOGPROBS:
        raise ValueError(f"algorithm.old_logprobs={mode!r}: use one of {', '.join(OLD_LOGPROBS)}")
    if mode == "engine":
        return ENGINE
    kl_before_update = kl_in_reward and kl_coef > 0  # the rewards need the old log-probs
    if mode == "auto" and minibatches * epochs == 1 and not kl_before_update:
        return UPDATE
    return RECOMPUTE


def needs_forward(mode: str, minibatches: int, kl_in_reward: bool, kl_coef: float, epochs: int = 1) -> bool:
    """Whether a recipe spends a trainer forward on old log-probs (the planner's count)."""
    return source(mode, minibatches, kl_in_reward, kl_coef, epochs) == RECOMPUTE
