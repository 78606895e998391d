"""A run whose rewards carry no signal, said once, in one line that names the likely cause.

GRPO learns from the differences between the samples of one prompt: a group whose samples all got the
same reward has advantages of 0 and teaches nothing. A step whose every group is flat (every reward 0, or
one reward within each group) moves the policy by its KL term alone, toward the reference; its loss and
gradient norm are 0 without one. `logger.no_signal_steps` such steps in a row (0: never said) and the run
says so, once, with what the samples of those steps came back as: when one status holds (nearly) all of
them it is the likely cause (100% no_code: the completions hold no code block), otherwise the groups are
too alike to compare. `megatron-rl report` says the same of the longest such stretch in a run's records.
PPO (a record with `value_loss`) compares each token with the critic's value, not with the group, so its
step is flat only when every sample of the batch got one reward.
"""

from __future__ import annotations

from megatron_rl.reward.result import LIKELY_CAUSE
from megatron_rl.telemetry.report import percent, status_shares

DOMINANT = 0.9  # a status this share of the samples is the cause; below it, the statuses are mixed


def flat(record: dict) -> bool:
    """Every group of the step got one reward per group (older records, without the figure: unknown, no); for
    PPO, every sample of the step one reward."""
    reward = record.get("reward") or {}
    if "value_loss" in record:
        return reward.get("min") is not None and reward.get("min") == reward.get("max")
    fraction = reward.get("flat_group_fraction")
    return fraction is not None and fraction >= 1.0


def no_signal_line(records: list[dict], samples: str = "") -> str:
    """The line for a stretch of flat steps (`records`, consecutive); `samples`: where their completions
    can be read (outputs/<run>/samples.jsonl)."""
    a, b, n = records[0]["step"], records[-1]["step"], len(records)
    zero = all((r.get("reward") or {}).get("max", 1.0) == 0 for r in records)
    what = "every reward was 0" if zero else "the samples of each prompt all got one reward"
    where = f"steps {a}-{b}" if n > 1 else f"step {a}"
    line = (
        f"no learning signal for {n} step{'s' if n != 1 else ''} in a row ({where}): {what}, so every "
        f"advantage is 0 and the policy learns nothing; likely cause: {_cause(records)}"
    )
    return line + (f" (read a few in {samples})" if samples else "")


def _cause(records: list[dict]) -> str:
    """The statuses of the stretch's samples: one that holds nearly all of them is the cause; mixed ones
    with every reward 0 still name the most frequent one's; mixed ones with rewards to earn mean groups
    too alike to compare."""
    shares = status_shares(records)
    if not shares:
        return "unknown (the step records hold no reward statuses)"
    top, share = next(iter(shares.items()))
    capped = all((r.get("tokens") or {}).get("truncated_fraction") == 1.0 for r in records)
    cap = "; every completion ran to the rollout.max_new_tokens cap" if capped else ""
    meaning = LIKELY_CAUSE.get(top, "read the samples")
    if share >= DOMINANT:
        return f"{percent(share)} {top}: {meaning}{cap}"
    mixed = ", ".join(f"{percent(v)} {k}" for k, v in list(shares.items())[:3])
    if all((r.get("reward") or {}).get("max", 1.0) == 0 for r in records):
        return f"{mixed}; most often {top}: {meaning}{cap}"
    return (
        f"{mixed}, but the samples of each prompt score alike: more samples per prompt "
        f"(rollout.samples_per_prompt) or a higher rollout.temperature spread them{cap}"
    )


class SignalWatch:
    """Fed every step record of the run (rank 0); returns the line once, at the `steps`-th flat step in
    a row, and None otherwise (`steps` 0: never)."""

    def __init__(self, steps: int, samples: str = "") -> None:
        self.steps, self.samples = steps, samples
        self.streak: list[dict] = []
        self.said = False

    def see(self, record: dict) -> str | None:
        if self.said or self.steps <= 0:
            return None
        self.streak = [*self.streak, record] if flat(record) else []
        if len(self.streak) < self.steps:
            return None
        self.said = True
        return no_signal_line(self.streak, self.samples)


def longest_flat_stretch(records: list[dict], steps: int, samples: str = "") -> dict | None:
    """The longest stretch of consecutive flat steps, when it is at least `steps` long (`steps` 0: never):
    its first and last step and its line (`samples`: where the run's kept completions are)."""
    best: list[dict] = []
    stretch: list[dict] = []
    for r in records:
        if not flat(r):
            stretch = []
            continue
        if stretch and r["step"] != stretch[-1]["step"] + 1:  # a gap in the records ends a stretch
            stretch = []
        stretch.append(r)
        if len(stretch) > len(best):
            best = list(stretch)
    if steps <= 0 or len(best) < steps:
        return None
    return {"steps": [best[0]["step"], best[-1]["step"]], "line": no_signal_line(best, samples)}
