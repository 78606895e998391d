"""An engine rank of a separated job: take each publication, generate, score, send the batch.

The trainer ranks run `train.py`'s loop; these ranks walk the same meetings (parallel/schedule.py) from
the other side: a control word from job rank 0 (go on, or stop: a preempted run), the publication
(reshard over the job group, staged, validated, activated: the same Publisher and refusal policy as a
colocated run), then the batches due, generated with the version just activated, scored in this
engine leader's share of the reward pool and gathered to every trainer rank (loop/step/collect.py).

Nothing here is saved in checkpoints: an engine holds only the published policy, the task's position
and (rollout.partial) the groups carried between batches, which the trainer sends at start and, for
the carry, receives with every batch (loop/placement/feed.py, loop/step/carry.py).

Signals: SIGUSR1/SIGTERM ask the run to save and stop, and they reach every rank; the trainer saves at
the end of its step and then tells the engines to stop, so an engine that died at once would leave the
trainer's step unfinished. Engine ranks therefore note the signal and go on until told. The price:
when a trainer rank crashes, the launcher's SIGTERM does not end the engine ranks; its SIGKILL after
the grace period (torchrun: 30 s; Slurm: KillWait) does.
"""

from __future__ import annotations

import logging
import signal

import torch.distributed as dist

from megatron_rl.loop.placement.feed import STOP, control
from megatron_rl.loop.step import components
from megatron_rl.loop.step.collect import collect_batch
from megatron_rl.parallel import schedule

log = logging.getLogger(__name__)


def serve(run, procs, records, problems=None) -> int:
    """An engine rank's whole run (`run`: the resolved run, run/resolve.py; `records`: the run's records,
    loop/record/records.py; `problems`: the problem set job rank 0 shared, components.read_problems)."""
    cfg = run.recipe
    with records.phase("init"):
        engine = components.build_engine(run, procs, records.dir)
        engine_index, is_leader = components.engine_role(procs)
        task = components.build_task(run, problems)
        pool = components.build_reward_pool(run, is_leader, task)
        publisher = components.build_publisher(run, procs, engine)
        refusals = components.build_refusals(run, publisher)
        prober = components.build_prober(run, procs, records.timer, engine=engine)
    box = [None, None, None]
    dist.broadcast_object_list(box, src=0, group=procs.job_cpu_group)  # from the trainer's feed
    start, task_state, carry = box  # carry: rollout.partial's carried groups, else None
    task.load_state(task_state)
    publisher.next_version = start + 1
    _ignore_preemption_signals()  # the trainer saves and tells us to stop; we must not die first
    k = run.staleness
    defer = schedule.defers_scoring(
        cfg.algorithm, cfg.rollout, k
    )  # as the trainer's feed decides (loop/placement/feed.py)
    try:
        for step in range(start, cfg.steps):
            if control(procs, None) == STOP:
                break
            if schedule.publish_due(step, start, k, cfg.steps):
                with records.phase("publish"):
                    refusals.publish(list, step, prober)  # an engine rank sends nothing
            due = schedule.batches_before_train(step, start, k, cfg.steps)
            for t in due + schedule.batches_after_train(step, k, cfg.steps):
                group = procs.job_cpu_group
                *_, pending = collect_batch(
                    cfg,
                    engine,
                    engine_index,
                    is_leader,
                    task,
                    pool,
                    records.timer,
                    t,
                    group=group,
                    carry=carry,
                    defer=defer,
                )
                if pending is not None:  # the samples went out unscored; their rewards follow at once, and
                    pending.wait()  # the trainer takes them after its forwards (Feed.rewards)
            # The trainer records the engines' timing from the batches it receives; none is kept here.
            records.timer.take()
            records.timer.take_spans()
    finally:
        if pool is not None:
            pool.close()
    dist.barrier(group=procs.job_cpu_group)
    return 0


def _ignore_preemption_signals() -> None:
    def note(signum, frame) -> None:
        log.warning("engine rank got %s: the trainer decides when to stop", signal.Signals(signum).name)

    for s in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(s, note)
