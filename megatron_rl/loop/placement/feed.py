"""The trainer's side of rollout: publish its weights, get its batches, whatever the placement.

Two kinds, one interface (`Feed`): colocated (colocated.py: the device passes to the engine by
time-sharing, the policy lands, this rank's engine generates, and the device comes back) and separated
(separated.py: the engines live on ranks of their own, loop/placement/pools.py and engine_pool.py; the
trainer publishes over the job group and receives the batches the engines send, in the order
parallel/schedule.py gives both pools -- synchronously, or k steps ahead when asynchronous, so the
engines generate step s+k's batch while step s trains). loop/step/components.py `build_feed` builds the
one the layout says.

Checkpoints must not lose or repeat prompts: with the engines ahead, the task has already drawn the
prompts of batches not trained yet. `task_state(step)` is the task's state from before the batch of
`step` was drawn, which a checkpoint taken after `step - 1` steps saves; a resumed run draws those
prompts again, and the engines generate them again with the resumed policy. With partial rollouts
the groups carried into that batch are saved with it (`carry_state`, loop/step/carry.py), so their tokens
are neither lost nor drawn twice.
"""

from __future__ import annotations

import copy
import os
from functools import partial

import torch.distributed as dist

from megatron_rl.loop.step.carry import carry_from_record, carry_record
from megatron_rl.parallel import schedule
from megatron_rl.reshard.faults import ENV as FAULT_ENV
from megatron_rl.reshard.faults import FaultInjector

GO, STOP = "go", "stop"


class Feed:
    """What both placements share: the versions published and their lag, the task's positions a
    checkpoint may need, partial rollouts' carry, and the publication (with its probe and, in tests,
    injected faults). The placement's own meetings are its subclass's."""

    def __init__(self, run, procs, log, policy, task, refusals, start: int, carried=None, prober=None):
        """`run`: the resolved run (run/resolve.py); `log`: the run's records (loop/record/records.py);
        `carried`: the carry a resumed checkpoint saved (records); `prober`: the log-prob probe of every
        activated version, before it serves (loop/placement/probe.py)."""
        self.run, self.cfg, self.procs, self.log, self.policy, self.task = (
            run,
            run.recipe,
            procs,
            log,
            policy,
            task,
        )
        self.refusals, self.start, self.prober = refusals, start, prober
        self.faults = FaultInjector.from_env(run.spec, run.layout.tp) if os.environ.get(FAULT_ENV) else None
        if self.faults is not None:
            log.say(f"{FAULT_ENV} is set: publications {self.faults.plan} are made faulty on purpose")
        self.k = run.staleness
        self.task_states: dict[int, tuple] = {}  # step -> (task state, carry) before its batch was drawn
        self.published_at: dict[int, int] = {}  # activated version -> the step whose policy it holds
        # Versions published before a resume: P(v) was published at step v - 1 (exact unless a publication
        # was refused before the checkpoint), so carried tokens of those versions show their lag.
        self.published_at.update({v: v - 1 for v in range(1, start + 1)})
        # rollout.partial: the groups cut by the last batch, the same on every rank of the job
        saved = resumed_carry(self.cfg, carried)  # refuses a carry this run cannot continue
        self.carry = carry_from_record(saved, task) if self.cfg.rollout.partial else None
        # A batch returns when generation ends and its rewards follow (`rewards`), where it can
        self.defer = schedule.defers_scoring(self.cfg.algorithm, self.cfg.rollout, self.k)
        self.pending = None  # the batch's PendingRewards (collect.py) until `rewards` has waited for them

    # ---- the meetings: the placement's ----
    def publish(self, step: int):
        """The policy of `step` goes to the engines. Returns the publication's result; None where none is
        due (asynchronous, the last k steps: no batch would be drawn with it)."""
        result = self._publish(step, self._publication(step))
        if result is not None and result.activated:
            self.published_at[result.version] = step
        return result

    def _publish(self, step: int, publish):
        raise NotImplementedError

    def batch(self, step: int) -> tuple:
        """Step `step`'s scored samples, their CollectStats and the sampling rounds drawn."""
        raise NotImplementedError

    def rewards(self) -> None:
        """The last batch's verifier rewards, filled into its samples (in place) once the reward pool has
        scored them; the forwards that need no reward run before this. Collective over the job: every rank
        calls it once per batch, also where the batch came scored (it then returns at once)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()

    def after_train(self, step: int) -> None:
        """Asynchronous: receive the batch the engines drew while this step trained."""

    def stop(self, step: int) -> None:
        """Tell the engines the run ends after `step` (preemption, a disagreement that stops the run)."""

    def take_wait(self) -> float:
        """Seconds this step's trainer waited on the engines' batches (separated placement)."""
        return 0.0

    def close(self) -> None:
        """Release what the placement holds beside the engine (the colocated reward pool)."""

    # ---- shared ----
    def _publication(self, step: int):
        named = self.policy.named_parameters_global
        if self.faults is not None:  # tests and benchmarks/agreement.py only (reshard/faults.py)
            named = self.faults.wrap(named, lambda: self.refusals.publisher.next_version)
        return partial(self.refusals.publish, named, step, self._probe())

    def _probe(self):
        """The probe as the publication calls it (colocated, the engine first wakes its KV cache)."""
        return self.prober

    def lag(self, samples, step: int) -> dict:
        """How many updates behind the trained policy the samples' versions are: 0 when synchronous
        (unless a refused publication left an older version serving), at most k when asynchronous, plus
        rollout.partial_max_cuts with partial rollouts. Per sample its oldest token ("max", "mean"), and
        over every token ("token_mean")."""
        lags = [self.lag_of(s.version, step) for s in samples]
        tokens = [self.lag_of(v, step) for s in samples for v in s.versions]
        return {
            "max": max(lags),
            "mean": sum(lags) / len(lags),
            "token_mean": sum(tokens) / len(tokens) if tokens else 0.0,
        }

    def lag_of(self, version: int, step: int) -> int:
        """How many updates behind the policy trained at `step` the policy `version` is."""
        return step - self.published_at.get(version, step)

    def task_state(self, step: int) -> dict:
        """The task's state before the batch of `step` was drawn (current if it was not drawn yet)."""
        self._forget_before(step)
        return self.task_states[step][0] if step in self.task_states else self.task.state()

    def carry_state(self, step: int) -> dict | None:
        """The groups carried into the batch of `step` (rollout.partial), as a checkpoint's records, with
        the settings they were cut under (a resume refuses others: `resumed_carry`)."""
        if self.carry is None:
            return None
        carry = self.task_states[step][1] if step in self.task_states else self.carry
        return {"settings": carry_settings(self.cfg), "groups": carry_record(carry, self.task)}

    def _keep_position(self, step: int) -> None:
        # Copies: never aliased to the live task or carry, which the batch is about to move.
        self.task_states[step] = (copy.deepcopy(self.task.state()), copy.deepcopy(self.carry))

    def _forget_before(self, step: int) -> None:
        for old in [s for s in self.task_states if s < step]:  # positions a save can no longer need
            del self.task_states[old]


def carry_settings(cfg) -> dict:
    """What carried groups depend on: their size, their caps, and how many are in flight."""
    ro = cfg.rollout
    return {
        "samples_per_prompt": ro.samples_per_prompt,
        "max_new_tokens": ro.max_new_tokens,
        "prompts_per_step": cfg.data.prompts_per_step,
        "oversample": ro.oversample,
    }


def resumed_carry(cfg, saved: dict | None) -> list[dict]:
    """The carried groups of a resumed checkpoint, refused when the run's settings no longer fit them (a
    group of n samples cannot be trained as one of m; more carried groups than a batch holds break the
    lag bound) or when partial rollouts were turned off (their prompts, already drawn, would be lost)."""
    if isinstance(saved, list) and saved:  # an early format: groups without the settings they were cut under
        raise SystemExit(
            f"the checkpoint carries {len(saved)} groups cut by partial rollouts without the settings they were "
            "cut under, so this run cannot tell whether they fit: start afresh with checkpoint.resume=none"
        )
    if not saved or not saved.get("groups"):
        return []
    if not cfg.rollout.partial:
        raise SystemExit(
            f"the checkpoint carries {len(saved['groups'])} groups cut by partial rollouts, and this run has "
            "rollout.partial=false: their prompts were drawn and would be lost. Resume with rollout.partial=true "
            "(and the settings the run started with), or start afresh with checkpoint.resume=none"
        )
    now = carry_settings(cfg)
    changed = {k: (v, now[k]) for k, v in saved["settings"].items() if now.get(k) != v}
    if changed:
        said = ", ".join(f"{k} was {a}, now {b}" for k, (a, b) in changed.items())
        raise SystemExit(
            f"the checkpoint carries groups cut by partial rollouts under other settings ({said}): resume "
            "with the settings the run started with, or start afresh with checkpoint.resume=none"
        )
    return saved["groups"]


def control(procs, word: str | None) -> str:
    """Job rank 0 says whether the run goes on; every rank of the job hears it. Collective."""
    box = [word]
    dist.broadcast_object_list(box, src=0, group=procs.job_cpu_group)
    return box[0]
