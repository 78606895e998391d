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
With no active version at all (the first publication), there is nothing to sample with: retry.

Every rank reaches the same decision: a refusal is agreed across ranks before it is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch

from megatron_rl.reshard.publish import Publisher, PublishResult

log = logging.getLogger(__name__)
POLICIES = ("stop", "skip", "retry")


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
            served = self.publisher.last_activated
            log.warning(
                "publication of version %d (step %d) refused, %d in a row; version %s keeps serving: %s",
                result.version,
                step,
                self.in_a_row,
                served,
                "; ".join(result.problems[:5]),
            )
            # `skip` never stops while a version serves; with none serving, every policy retries
            if self.in_a_row >= self.max_in_a_row and (self.policy != "skip" or served is None):
                if self.publisher.rank != 0:
                    raise PublicationRefused(1)  # rank 0 says why, once
                raise PublicationRefused(
                    f"weight publication refused {self.in_a_row} times in a row "
                    f"(rollout.on_refused_publication={self.policy}, "
                    f"rollout.max_refused_publications={self.max_in_a_row}); the last refusal (version "
                    f"{result.version}, step {step}):\n  " + "\n  ".join(result.problems[:10])
                )
            if self.policy == "retry" or served is None:
                continue
            result.action = f"sampled with the active version {served}"
            return result
