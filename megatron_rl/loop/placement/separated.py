"""The separated feed: the trainer's ranks and the engines' are disjoint pools (pools.py; the engine
ranks walk engine_pool.py). Job rank 0 says at every step whether the run goes on; the publication
crosses over the job group when one is due; the batches come back over its gloo twin in the order
parallel/schedule.py gives both pools -- this step's (synchronous), or k steps ahead (asynchronous: the
engines generate step s+k's batch while step s trains, and the trainer receives it after training).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from megatron_rl.loop.placement.feed import GO, STOP, Feed, control
from megatron_rl.loop.step.collect import collect_batch
from megatron_rl.parallel import schedule


class SeparatedFeed(Feed):
    def __init__(self, run, procs, log, policy, task, refusals, start, carried=None, prober=None):
        super().__init__(run, procs, log, policy, task, refusals, start, carried, prober)
        self.batches: dict[int, tuple] = {}  # step -> (samples, stats, rounds), drawn, not yet trained
        self.waited = 0.0
        # The engines learn where to start, from which prompts and carried groups.
        box = [start, task.state(), self.carry]
        dist.broadcast_object_list(box, src=0, group=procs.job_cpu_group)

    def _publish(self, step: int, publish):
        control(self.procs, GO)
        return publish() if schedule.publish_due(step, self.start, self.k, self.cfg.steps) else None

    def batch(self, step: int) -> tuple:
        self._forget_before(step)
        for t in schedule.batches_before_train(step, self.start, self.k, self.cfg.steps):
            self._receive(t)  # synchronous: this step's; asynchronous, first step: the first k
        *batch, self.pending = self.batches.pop(step)
        return tuple(batch)

    def after_train(self, step: int) -> None:
        for t in schedule.batches_after_train(step, self.k, self.cfg.steps):
            self._receive(t)

    def stop(self, step: int) -> None:
        """After the last step the engines have left their loop already and wait at the final barrier:
        nothing to tell them then."""
        if step + 1 < self.cfg.steps:
            control(self.procs, STOP)

    def take_wait(self) -> float:
        out, self.waited = self.waited, 0.0
        return round(out, 6)

    def _receive(self, t: int) -> None:
        self._keep_position(t)
        t0 = time.perf_counter()
        with self.log.phase("rollout_wait"):
            batch = collect_batch(
                self.cfg,
                None,
                -1,
                False,
                self.task,
                None,
                self.log.timer,
                t,
                group=self.procs.job_cpu_group,
                carry=self.carry,
                defer=self.defer,  # the engine leaders send the rewards later (Feed.rewards)
            )
        self.waited += time.perf_counter() - t0
        stats = batch[1]
        # The engines' time, as the step's generation and scoring phases: it ran on the engine ranks.
        self.log.timer.add("generation", stats.generation_s, stats.mem_gib.get("generation", 0.0))
        self.log.timer.add("scoring", stats.scoring_tail_s, stats.mem_gib.get("scoring", 0.0))
        self.batches[t] = batch
