"""What a step does when its weight publication is refused (`rollout.on_refused_publication`).

The publisher never activates a refused version: the engines keep serving the previous one
(reshard/publish.py). The run then has three choices, and which one is right depends on the fault:
- `stop` (default): sample this step with the active version, as `skip` does, but end the run once
  `max_refused_publications` publications in a row were refused -- a transient fault (a flipped bit
  in transit) passes, a persistent one (NaN weights) does not train on for long unnoticed;
- `skip`: always sample with the active version; the trainer keeps learning from samples of an
  older policy, which the step record shows (`version` < `published_version`, `publication.action`);
- `retry`: publish the same weights again at once, under the next version number; end the run after
  `max_refused_publications` refusals in a row.
With no servable version, there is nothing to sample with, whatever the policy: retry, and end the
run after `max_refused_publications` in a row. That is the first publication, and every publication
after a level-2 sleep (`rollout.sleep_level`, rollout/delivery.py: the GPU default with in-place
delivery), which discards the engine's weights: the active version can no longer serve
(`Publisher.serving()` asks the engines' sinks, `holds_weights`), and sampling anyway would either
fail ("the engine holds no policy weights") or serve garbage. Keeping the previous version servable at
level 2 would take a second copy of the engine's weights through training -- on the device, the
memory level 2 exists to free; on the host, exactly what level 1 does -- so the promise is kept by
refusing the combination instead: `skip` needs `rollout.sleep_level=1` on GPU (`megatron-rl validate`
refuses `skip` at level 2), and at level 2 `stop` retries at once rather than sampling an old version.

Every rank reaches the same decision: a refusal is agreed across ranks before it is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch

from megatron_rl.config.choices import REFUSAL_POLICIES as POLICIES
from megatron_rl.reshard.publish import Publisher, PublishResult

log = logging.getLogger(__name__)


class PublicationRefused(SystemExit):
    """The run ends: too many refusals in a row. A SystemExit: the message is the whole report."""


class RefusalPolicy:
    def __init__(self, publisher: Publisher, policy: str = "stop", max_in_a_row: int = 3):
        if policy not in POLICIES:
            raise ValueError(f"rollout.on_refused_publication={policy!r}: use one of {', '.join(POLICIES)}")
        if max_in_a_row < 1:
            raise ValueError(f"rollout.max_refused_publications={max_in_a_row}: must be >= 1")
        self.publisher, self.policy, self.max_in_a_row = publisher, policy, max_in_a_row
        self.in_a_row = 0

    def publish(
        self, named_params: Callable[[], Iterable[tuple[str, torch.Tensor]]], step: int
    ) -> PublishResult:
        """Publish this step's weights; on refusal, retry, go on with the active version, or stop."""
        attempts = 0
        while True:
            result = self.publisher.publish(named_params(), step)
            attempts += 1
            result.attempts = attempts
            if result.activated:
                self.in_a_row = 0
                return result
            self.in_a_row += 1
            served = self.publisher.serving()  # None also when the engines discarded the active version
            active = self.publisher.last_activated
            log.warning(
                "publication of version %d (step %d) refused, %d in a row; %s: %s",
                result.version,
                step,
                self.in_a_row,
                f"version {served} keeps serving" if served is not None else _nothing_serves(active),
                "; ".join(result.problems[:5]),
            )
            # `skip` never stops while a version serves; with none serving, every policy retries
            if self.in_a_row >= self.max_in_a_row and (self.policy != "skip" or served is None):
                if self.publisher.rank != 0:
                    raise PublicationRefused(1)  # rank 0 says why, once
                why = "" if served is not None or active is None else f"; {_nothing_serves(active)}"
                raise PublicationRefused(
                    f"weight publication refused {self.in_a_row} times in a row "
                    f"(rollout.on_refused_publication={self.policy}, "
                    f"rollout.max_refused_publications={self.max_in_a_row}){why}; the last refusal (version "
                    f"{result.version}, step {step}):\n  " + "\n  ".join(result.problems[:10])
                )
            if self.policy == "retry" or served is None:
                continue
            result.action = f"sampled with the active version {served}"
            return result


def _nothing_serves(active: int | None) -> str:
    if active is None:
        return "no version was ever activated"
    return (
        f"version {active} cannot serve: the engines discarded its weights at a level-2 sleep "
        "(rollout.sleep_level=1 keeps them, and lets `skip`/`stop` sample with it)"
    )
