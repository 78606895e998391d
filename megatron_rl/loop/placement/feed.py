"""The trainer's side of rollout: publish its weights, get its batches, whatever the placement.

Colocated: the device passes to the engine (time-sharing), the policy lands, this rank's engine
generates, and the device comes back (loop/placement/timeshare.py). Separated: the engines live on ranks of
their own (loop/placement/pools.py, loop/placement/engine_pool.py); the trainer publishes over the job group and receives
the batches the engines send, in the order parallel/schedule.py gives both pools -- synchronously, or k
steps ahead when asynchronous, so the engines generate step s+k's batch while step s trains.

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
import time
from functools import partial

import torch.distributed as dist

from megatron_rl.loop.step.carry import carry_from_record, carry_record
from megatron_rl.loop.step.collect import collect_batch
from megatron_rl.parallel import schedule
from megatron_rl.reshard.faults import ENV as FAULT_ENV
from megatron_rl.reshard.faults import FaultInjector

GO, STOP = "go", "stop"


class Feed:
    def __init__(
        self, cfg, procs, run, policy, task, refusals, start: int, colocated=None, carried=None, prober=None
    ):
        """`colocated`: (timeshare, engine, engine_index, is_leader, reward_pool) of a colocated rank;
        None on a separated job's trainer rank. `carried`: the carry a resumed checkpoint saved (records).
        `prober`: the log-prob probe of every activated version, before it serves (loop/placement/probe.py)."""
        self.cfg, self.procs, self.run, self.policy, self.task = cfg, procs, run, policy, task
        self.refusals, self.start, self.colocated, self.prober = refusals, start, colocated, prober
        self.faults = (
            FaultInjector.from_env(policy.spec, procs.state.tp) if os.environ.get(FAULT_ENV) else None
        )
        if self.faults is not None:
            run.say(f"{FAULT_ENV} is set: publications {self.faults.plan} are made faulty on purpose")
        self.k = schedule.staleness(cfg.layout, cfg.rollout)
        self.batches: dict[int, tuple] = {}  # step -> (samples, stats, rounds), drawn, not yet trained
        self.task_states: dict[int, tuple] = {}  # step -> (task state, carry) before its batch was drawn
        self.waited = 0.0
        self.published_at: dict[int, int] = {}  # activated version -> the step whose policy it holds
        # Versions published before a resume: P(v) was published at step v - 1 (exact unless a publication
        # was refused before the checkpoint), so carried tokens of those versions show their lag.
        self.published_at.update({v: v - 1 for v in range(1, start + 1)})
        # rollout.partial: the groups cut by the last batch, the same on every rank of the job
        saved = resumed_carry(cfg, carried)  # refuses a carry this run cannot continue
        self.carry = carry_from_record(saved, task) if cfg.rollout.partial else None
        if colocated is None:  # the engines learn where to start, from which prompts and carried groups
            box = [start, task.state(), self.carry]
            dist.broadcast_object_list(box, src=0, group=procs.job_cpu_group)

    # ---- the two meetings ----
    def publish(self, step: int):
        """The policy of `step` goes to the engines. Returns the publication's result; None where none is
        due (asynchronous, the last k steps: no batch would be drawn with it)."""
        named = self.policy.named_parameters_global
        if self.faults is not None:  # tests and benchmarks/agreement.py only (reshard/faults.py)
            named = self.faults.wrap(named, lambda: self.refusals.publisher.next_version)
        publish = partial(self.refusals.publish, named, step, self._probe())
        if self.colocated is not None:
            result = self.colocated[0].to_rollout(publish)
        else:
            control(self.procs, GO)
            result = publish() if schedule.publish_due(step, self.start, self.k, self.cfg.steps) else None
        if result is not None and result.activated:
            self.published_at[result.version] = step
        return result

    def _probe(self):
        """The probe as the publication calls it: colocated, the engine first wakes its KV cache."""
        if self.prober is None or self.colocated is None:
            return self.prober

        def probe(version: int):
            self.colocated[0].ready_to_serve()
            return self.prober(version)

        return probe

    def batch(self, step: int) -> tuple:
        """Step `step`'s scored samples, their CollectStats and the sampling rounds drawn."""
        for old in [s for s in self.task_states if s < step]:  # positions a save can no longer need
            del self.task_states[old]
        if self.colocated is not None:
            timeshare, engine, engine_index, is_leader, pool = self.colocated
            self._keep_position(step)
            out = collect_batch(
                self.cfg,
                engine,
                engine_index,
                is_leader,
                self.task,
                pool,
                self.run.timer,
                step,
                group=self.procs.job_cpu_group,  # host objects: gloo (NCCL would stage them on the GPU)
                carry=self.carry,
            )
            timeshare.to_train()  # the engine sleeps; the trainer takes the device back
            return out
        for t in schedule.batches_before_train(step, self.start, self.k, self.cfg.steps):
            self._receive(t)  # synchronous: this step's; asynchronous, first step: the first k
        return self.batches.pop(step)

    def after_train(self, step: int) -> None:
        """Asynchronous: receive the batch the engines drew while this step trained."""
        if self.colocated is None:
            for t in schedule.batches_after_train(step, self.k, self.cfg.steps):
                self._receive(t)

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

    def stop(self, step: int) -> None:
        """Tell the engines the run ends after `step` (preemption). After the last step they have left
        their loop already and wait at the final barrier: nothing to tell them then."""
        if self.colocated is None and step + 1 < self.cfg.steps:
            control(self.procs, STOP)

    def task_state(self, step: int) -> dict:
        """The task's state before the batch of `step` was drawn (current if it was not drawn yet)."""
        for old in [s for s in self.task_states if s < step]:
            del self.task_states[old]
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

    def take_wait(self) -> float:
        """Seconds this step's trainer waited on the engines' batches (separated placement)."""
        out, self.waited = self.waited, 0.0
        return round(out, 6)

    def _receive(self, t: int) -> None:
        self._keep_position(t)
        t0 = time.perf_counter()
        with self.run.phase("rollout_wait"):
            batch = collect_batch(
                self.cfg,
                None,
                -1,
                False,
                self.task,
                None,
                self.run.timer,
                t,
                group=self.procs.job_cpu_group,
                carry=self.carry,
            )
        self.waited += time.perf_counter() - t0
        stats = batch[1]
        # The engines' time, as the step's generation and scoring phases: it ran on the engine ranks.
        self.run.timer.add("generation", stats.generation_s, stats.mem_gib.get("generation", 0.0))
        self.run.timer.add("scoring", stats.scoring_tail_s, stats.mem_gib.get("scoring", 0.0))
        self.batches[t] = batch


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
