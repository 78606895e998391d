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

A publication whose bytes arrived whole can still mean another model (a conversion bug): the log-prob
probe (loop/placement/probe.py) scores a few fixed samples on the engines and the trainer right after activation,
before the engines draw anything with the version. `rollout.on_logprob_disagreement` says what a
disagreement does:
- `refuse` (default): the version is refused like one whose manifest failed -- the engines go back to
  the version they served before (`Publisher.roll_back`) and the refusal policy above decides what
  follows, `stop` ending the run after `max_refused_publications` in a row;
- `stop`: the run ends at once;
- `warn`: one line on the console, and the version serves.
The step's own agreement (the trainer's old log-probs against the engine's, train.py) acts the same way
(`after_step`): it cannot unserve the batch it measured, so under `refuse` the run ends after
`max_refused_publications` steps in a row disagree.

Every rank reaches the same decision: a refusal is agreed across ranks before it is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from megatron_rl.config.choices import DISAGREEMENT_ACTIONS
from megatron_rl.config.choices import REFUSAL_POLICIES as POLICIES
from megatron_rl.reshard.publish import Publisher, PublishResult
from megatron_rl.rollout.agreement import Thresholds

if TYPE_CHECKING:
    from megatron_rl.loop.placement.probe import ProbeVerdict

log = logging.getLogger(__name__)


class PublicationRefused(SystemExit):
    """The run ends: too many refusals in a row. A SystemExit: the message is the whole report."""


class RefusalPolicy:
    def __init__(
        self,
        publisher: Publisher,
        policy: str = "stop",
        max_in_a_row: int = 3,
        on_disagreement: str = "refuse",
        thresholds: Thresholds | None = None,
    ):
        if policy not in POLICIES:
            raise ValueError(f"rollout.on_refused_publication={policy!r}: use one of {', '.join(POLICIES)}")
        if on_disagreement not in DISAGREEMENT_ACTIONS:
            raise ValueError(
                f"rollout.on_logprob_disagreement={on_disagreement!r}: use one of {', '.join(DISAGREEMENT_ACTIONS)}"
            )
        if max_in_a_row < 1:
            raise ValueError(f"rollout.max_refused_publications={max_in_a_row}: must be >= 1")
        self.publisher, self.policy, self.max_in_a_row = publisher, policy, max_in_a_row
        self.on_disagreement, self.thresholds = on_disagreement, thresholds
        self.in_a_row = 0  # publications refused in a row
        self.steps_disagreeing = 0  # steps in a row whose own samples disagreed (after_step)

    def publish(
        self,
        named_params: Callable[[], Iterable[tuple[str, torch.Tensor]]],
        step: int,
        probe: Callable[[int], ProbeVerdict] | None = None,
    ) -> PublishResult:
        """Publish this step's weights; on refusal, retry, go on with the active version, or stop.

        `probe(version)` (loop/placement/probe.py): run on every activated version before it serves; a version it
        finds disagreeing is refused, ends the run or is only reported (`rollout.on_logprob_disagreement`)."""
        attempts = 0
        while True:
            result = self.publisher.publish(named_params(), step)
            attempts += 1
            result.attempts = attempts
            if result.activated and probe is not None:
                self._probe(result, probe(result.version), step)
            if result.activated:
                self.in_a_row = 0
                return result
            self.in_a_row += 1
            served = self.publisher.serving()  # None also when the engines discarded the active version
            active = self.publisher.last_activated
            self._say(
                f"publication of version {result.version} (step {step + 1}) refused, {self.in_a_row} in a row; "
                + (f"version {served} keeps serving" if served is not None else _nothing_serves(active))
                + ": "
                + "; ".join(result.problems[:5])
            )
            # `skip` never stops while a version serves; with none serving, every policy retries
            if self.in_a_row >= self.max_in_a_row and (self.policy != "skip" or served is None):
                why = "" if served is not None else f"; {_nothing_serves(active)}"
                self._end(
                    f"weight publication refused {self.in_a_row} times in a row "
                    f"(rollout.on_refused_publication={self.policy}, "
                    f"rollout.max_refused_publications={self.max_in_a_row}){why}; the last refusal (version "
                    f"{result.version}, step {step + 1}):\n  " + "\n  ".join(result.problems[:10])
                )
            if self.policy == "retry" or served is None:
                continue
            result.action = f"sampled with the active version {served}"
            return result

    def _probe(self, result: PublishResult, verdict: ProbeVerdict, step: int) -> None:
        """Act on the probe of the version `result` just activated (every rank holds the same verdict)."""
        result.probe = verdict.record(self.thresholds) if self.thresholds is not None else None
        if verdict.passed:
            self.publisher.settle()
            return
        line = disagreement_line(
            f"step {step + 1}: version {result.version}", verdict.problems, self.thresholds
        )
        if self.on_disagreement == "stop":
            self._end(f"{line}; the run stops (rollout.on_logprob_disagreement=stop)")
        if self.on_disagreement == "warn":
            self._say(f"{line}; it serves anyway (rollout.on_logprob_disagreement=warn)")
            self.publisher.settle()
            return
        # One line for the console; every engine's figures are in the step record (publication.probe).
        more = f" (and {len(verdict.problems) - 1} more engines)" if len(verdict.problems) > 1 else ""
        self.publisher.roll_back(
            result, [f"log-prob probe ({_pair(self.thresholds)}): {verdict.problems[0]}{more}"]
        )

    def after_step(self, step: int, version: int, problems: list[str]) -> str:
        """Act on the step's own agreement: `problems` (rollout/agreement.py `problems`, the same on every
        trainer rank) of the trainer's log-probs against the engines' on the samples of `version` it just
        trained. Returns why the run must stop now ("" to go on): the loop then tells the engines and ends.

        The batch is trained already, so what `refuse` can do is count: `max_refused_publications` steps in
        a row whose samples disagree end the run (one step that disagrees, between agreeing ones, is an
        outlier the next publication's probe judges anew); `stop` ends it at the first."""
        if not problems:
            self.steps_disagreeing = 0
            return ""
        line = disagreement_line(
            f"step {step + 1}: the samples of version {version}", [", ".join(problems)], self.thresholds
        )
        if self.on_disagreement == "stop":
            return f"{line}; the run stops (rollout.on_logprob_disagreement=stop)"
        if self.on_disagreement == "warn":
            self._say(f"{line} (rollout.on_logprob_disagreement=warn)")
            return ""
        self.steps_disagreeing += 1
        if self.steps_disagreeing >= self.max_in_a_row:
            return (
                f"{line}; {self.steps_disagreeing} steps in a row disagree "
                f"(rollout.max_refused_publications={self.max_in_a_row}): the run stops"
            )
        n = self.steps_disagreeing
        self._say(f"{line}: {n} {'step' if n == 1 else 'steps'} in a row")
        return ""

    def _say(self, line: str) -> None:
        if self.publisher.rank == 0:  # one line, not one per rank
            log.warning("%s", line)

    def _end(self, message: str) -> None:
        if self.publisher.rank != 0:
            raise PublicationRefused(1)  # rank 0 says why, once
        raise PublicationRefused(message)


def disagreement_line(what: str, problems: list[str], thresholds: Thresholds | None) -> str:
    """One console line: what disagreed, the figures against the thresholds, the dtypes they are set by."""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{what}: the engines' and the trainer's log-probs disagree ({_pair(thresholds)}): {problems[0]}{more}"


def _pair(thresholds: Thresholds | None) -> str:
    if thresholds is None:
        return "no thresholds"
    return f"{thresholds.trainer_dtype} trainer, {thresholds.engine_dtype} engine"


def _nothing_serves(active: int | None) -> str:
    if active is None:
        return "no version was ever activated"
    return (
        f"version {active} cannot serve: the engines discarded its weights at a level-2 sleep "
        "(rollout.sleep_level=1 keeps them, and lets `skip`/`stop` sample with it)"
    )
