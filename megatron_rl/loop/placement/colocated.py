"""The colocated feed: one process per device holds a trainer rank and its part of an engine, and the
device passes between them every step (timeshare.py).

    publish: the trainer offloads, the engine wakes its weights, the policy lands (and is probed, the
             engine's KV cache woken first), the engine wakes its KV cache
    batch:   this rank's engine generates and its engine leader scores (loop/step/collect.py), every rank
             receives every sample, then the engine sleeps and the trainer takes the device back; where
             the batch can be (parallel/schedule.py defers_scoring), as soon as generation ends, and
             `rewards` waits for the scores the pool is still computing
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_rl.loop.placement.feed import Feed
from megatron_rl.loop.step.collect import collect_batch


@dataclass(frozen=True)
class EngineSide:
    """What a colocated rank holds beside its trainer shard (loop/step/components.py `build_colocated`)."""

    timeshare: object  # timeshare.TimeShare: the device between trainer and engine
    engine: object  # this rank's part of a VLLMEngine
    engine_index: int  # which engine this rank serves
    is_leader: bool  # the engine's first TP rank: it alone scores and sends its samples
    pool: object | None  # the leader's share of the reward pool (reward/pool.py); None elsewhere


class ColocatedFeed(Feed):
    def __init__(self, run, procs, log, policy, task, refusals, start, carried, prober, side: EngineSide):
        super().__init__(run, procs, log, policy, task, refusals, start, carried, prober)
        self.side = side

    def _publish(self, step: int, publish):
        return self.side.timeshare.to_rollout(publish)

    def _probe(self):
        if self.prober is None:
            return None

        def probe(version: int):
            self.side.timeshare.ready_to_serve()  # the probe generates: the engine needs its KV cache
            return self.prober(version)

        return probe

    def batch(self, step: int) -> tuple:
        self._forget_before(step)
        self._keep_position(step)
        s = self.side
        out = collect_batch(
            self.cfg,
            s.engine,
            s.engine_index,
            s.is_leader,
            self.task,
            s.pool,
            self.log.timer,
            step,
            group=self.procs.job_cpu_group,  # host objects: gloo (NCCL would stage them on the GPU)
            carry=self.carry,
            defer=self.defer,
        )
        # the engine sleeps and the trainer takes the device back when generation ends, the leader's reward
        # pool still scoring: the forwards that need no reward run meanwhile (Feed.rewards)
        s.timeshare.to_train()
        *out, self.pending = out
        return tuple(out)

    def close(self) -> None:
        if self.side.pool is not None:
            self.side.pool.close()
