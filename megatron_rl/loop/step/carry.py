"""Partial rollouts (`rollout.partial`): the groups a batch cut, carried into the next batch.

With `rollout.oversample=f`, each batch has ceil(f x prompts_per_step) groups in flight and trains the
first prompts_per_step to finish all n samples. Without partial rollouts the rest are aborted and
dropped, and with them the long answers (the groups that finish last). With them, every unfinished
group is cut instead: its finished samples (already scored) and its unfinished ones (the tokens they
had, each with its log-prob and the version that drew it) are carried, and the next batch continues
them first, as requests of prompt + tokens so far, under the version then published. Nothing drawn is
lost, and no token a sample holds is generated again (a request cut in the middle of an engine step
loses that step's token, which was never recorded; its continuation draws that position afresh).

A carried group comes first in the next batch and counts toward what is in flight, so in the steady
state a batch draws about prompts_per_step new prompts, not f x as many. A group carried
`rollout.partial_max_cuts` times may not be cut again: the batch waits for it. That bounds how old any
token can be when it is trained: max_cuts + the asynchronous staleness (parallel/schedule.py) updates.

Every rank holds the same carry: the engine leaders that cut groups send them with their samples
(loop/step/collect.py `gather_all`), and every rank of the job receives them. A checkpoint saves the carry
from before the next batch was drawn, with the task's position (loop/placement/feed.py), as JSON: prompts as the
task's own records (`prompt_record`), samples as plain numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from megatron_rl.rollout.types import Partial, Sample


@dataclass
class CarriedGroup:
    """One prompt's group left over by a batch: scored samples, cut samples, and how often it was cut."""

    prompt: object  # the task's prompt (data/task.py, data/synthetic.py)
    finished: list[Sample] = field(default_factory=list)
    partial: list[Partial] = field(default_factory=list)
    cuts: int = 1  # batches that cut it after it had started (a group never started is not older)

    @property
    def tokens(self) -> int:
        """Completion tokens the group holds (finished and cut samples)."""
        return sum(len(s.token_ids) for s in self.finished) + sum(len(p.token_ids) for p in self.partial)


def carry_split(
    want: int, engine_count: int, factor: float, carried: int
) -> tuple[int, list[list[int]], list[int]]:
    """One draw with partial rollouts: (new prompts to draw, each engine's items, each engine's quota).

    Items are positions in [carried groups..., new prompts...]. The carried groups are dealt round robin
    and come first on each engine; engine e then draws new prompts up to ceil(factor x q_e) in flight,
    where q_e, its round-robin share of `want`, is what it trains (the first of its items to finish), as
    with rollout.oversample alone (collect.oversampled_split)."""
    quotas = [len(range(e, want, engine_count)) for e in range(engine_count)]
    split, start = [], carried
    for e, q in enumerate(quotas):
        mine = list(range(e, carried, engine_count))
        new = max(0, math.ceil(q * factor - 1e-9) - len(mine), q - len(mine))
        split.append(mine + list(range(start, start + new)))
        start += new
    return start - carried, split, quotas


def carry_record(groups: list[CarriedGroup], task) -> list[dict]:
    """The carry as JSON-able records (a checkpoint's run_state)."""
    return [
        {
            "prompt": task.prompt_record(g.prompt),
            "finished": [asdict(s) for s in g.finished],
            "partial": [asdict(p) for p in g.partial],
            "cuts": g.cuts,
        }
        for g in groups
    ]


def carry_from_record(records: list[dict] | None, task) -> list[CarriedGroup]:
    """The carry a checkpoint saved (none when it saved none: a run without partial rollouts)."""
    return [
        CarriedGroup(
            prompt=task.prompt_from_record(r["prompt"]),
            finished=[_restored(s) for s in r["finished"]],
            partial=[Partial(**p) for p in r["partial"]],
            cuts=int(r["cuts"]),
        )
        for r in records or []
    ]


def _restored(record: dict) -> Sample:
    """A carried finished sample from its record. A checkpoint written before samples recorded the
    engine's view (`engine_spans`) holds none: its samples are taken as saved, their own ids standing for
    the engine's (the trainer's token check, train.py, would otherwise stop the resumed run)."""
    sample = Sample(**record)
    if "engine_spans" not in record:
        from megatron_rl.rollout.types import token_digest

        sample.engine_spans = [(len(sample.token_ids), token_digest(sample.prompt_ids + sample.token_ids))]
    return sample
