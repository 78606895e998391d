"""GRPO, top to bottom. One process per GPU (torchrun or srun); every rank runs this same file.

    torchrun --nproc-per-node 2 -m megatron_rl.train grpo_tiny_cpu [overrides...]

Each step:
  1. generate n samples per prompt with the published policy; every finished sample is scored at
     once in the sandboxed reward pool, while the engine keeps generating;
  2. old-policy log-probs (before the first update; they also check the engine's log-probs) and
     reference log-probs (frozen copy; skipped when the KL coefficient is 0);
  3. group-relative advantages (per prompt, over its n samples);
  4. k minibatches, one optimizer step each: clipped surrogate + KL to the reference;
  5. publish (at the top of the next step, as the device passes back to the engine): reshard the
     trainer's shards into the engines' layout, in memory; stage, validate, activate.

Separated placement (`layout.placement=separated`): the engines run on ranks of their own, which walk
loop/placement/engine_pool.py instead of this loop; publication and batches cross over the job group
(loop/placement/pools.py, loop/placement/feed.py). Asynchronous (`layout.synchrony=async`), the engines draw the batch of
step s+k while step s trains (parallel/schedule.py), and the loss corrects for the lag with truncated
importance sampling against the engines' own log-probs.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from megatron_rl.algorithms import old_policy
from megatron_rl.check.recipe import validate_recipe
from megatron_rl.checkpoint.preempt import EXIT_REQUEUE, Preemption
from megatron_rl.config.load import load_recipe
from megatron_rl.loop.placement import engine_pool
from megatron_rl.loop.placement.feed import Feed
from megatron_rl.loop.placement.probe import step_problems
from megatron_rl.loop.placement.publication import PublicationRefused
from megatron_rl.loop.placement.timeshare import TimeShare
from megatron_rl.loop.record.run import seed_everything, start_run
from megatron_rl.loop.record.summary import step_metrics
from megatron_rl.loop.step import components
from megatron_rl.loop.step.rl_batch import (
    advantages_with_kl,
    assign,
    global_normaliser,
    grpo_loss_fn,
    kl_sums,
    loss_mask_keep,
    minibatch_extras,
)
from megatron_rl.rollout.logprob_check import compare
from megatron_rl.system.device import require_device
from megatron_rl.trainer.build import build_policy, frozen_copy
from megatron_rl.trainer.replay import routes_of


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    recipe = validate_recipe(load_recipe(args.recipe, args.overrides))  # `validate`'s check, before anything
    require_device(recipe.cluster)  # a GPU cluster where CUDA is unavailable: one line and exit 2
    cfg, algo, ro = recipe, recipe.algorithm, recipe.rollout
    seed_everything(cfg.seed)
    procs, run = start_run(cfg)  # the process groups; the run's records, console and sinks

    if not procs.is_trainer:  # an engine rank of a separated job (loop/placement/pools.py)
        return engine_pool.serve(cfg, procs, run)

    # ---- setup: trainer, reference, engines, reward pool, publisher, checkpoints ----
    with run.phase("init"):
        policy = build_policy(cfg, procs.state, with_optimizer=True)
        reference = frozen_copy(policy, cfg, procs.state) if algo.kl_coef > 0 else None
        colocated = None
        if procs.layout.colocated:
            # The engine claims its share of the device at construction: the trainer steps aside until it sleeps.
            timeshare = TimeShare.start(
                partial(components.build_engine, cfg, procs, run.dir),
                policy.optimizer,
                policy.ddp,
                reference,
                run.note_memory,
            )
            engine_index, is_leader = components.engine_role(procs)
            pool = components.build_reward_pool(cfg, is_leader)
            colocated = (timeshare, timeshare.engine, engine_index, is_leader, pool)
        task = components.build_task(cfg)
        engine = colocated[1] if colocated else None
        publisher = components.build_publisher(
            cfg, procs.layout, engine, group=procs.job_group, cpu_group=procs.job_cpu_group
        )
        refusals = components.build_refusals(cfg, publisher)  # what a refused or disagreeing version does
        prober = components.build_prober(cfg, procs, run.timer, policy=policy, engine=engine)
        checkpointer = components.build_checkpointer(cfg, procs, run.name)
        save_every = components.checkpoint_interval(cfg)
        # 0 unless a checkpoint is found; with partial rollouts, the groups it carried into its next batch
        start, carried = components.resume(cfg, procs, run, policy, reference, task)
        preemption = Preemption(procs.cpu_group)
    publisher.next_version = start + 1  # step s samples from version s + 1 (at most k older when async)
    feed = Feed(cfg, procs, run, policy, task, refusals, start, colocated, carried, prober)
    temp = components.trainer_temperature(ro)  # trainer log-probs follow the engine's convention
    if start >= cfg.steps:
        run.say(
            f"nothing to do: run {run.name} already reached step {start} (steps={cfg.steps}); raise steps=, "
            "or start afresh with checkpoint.resume=none and another MEGATRON_RL_RUN_NAME"
        )
    run.start_progress(start)
    preempted, halt = False, ""

    for step in range(start, cfg.steps):
        # 0. publish: colocated, hand the device to the engine (the trainer offloads, the engine wakes, the
        #    policy lands); separated, send it to the engine pool. Before it serves, the engines and the trainer
        #    score a fixed probe: a version whose log-probs disagree (a conversion bug the checksums cannot
        #    see) is refused like one whose bytes failed. A refused version never serves: the previous one
        #    keeps serving (RefusalPolicy). Asynchronous, the engines already drew this step's batch.
        with run.phase("publish"):
            publication = feed.publish(step)

        # 1. generate and score (streamed; separated: on the engine ranks), then every rank sees every sample
        samples, stats, rounds = feed.batch(step)
        lag = feed.lag(samples, step)  # 0 when synchronous; at most rollout.max_staleness when async
        newest = max(
            (v for s in samples for v in s.versions), default=-1
        )  # the agreement compares its tokens

        # 2. old-policy and reference log-probs of this DP rank's samples, before any update. The old ones
        #    are recomputed, or (algorithm.old_logprobs) taken from the engines, or, with one minibatch,
        #    from the update's own forward, which runs on the same weights (algorithms/old_policy.py)
        plan = assign(len(samples), procs.state.dp, algo.minibatches, cfg.seed, step)
        mine = sorted(i for minibatch in plan for i in minibatch[procs.state.dp_rank])
        seqs, plens = [samples[i].sequence for i in mine], [samples[i].prompt_len for i in mine]
        # algorithm.routing_replay: every forward below uses the experts the engine routed each token to
        replay = algo.routing_replay
        source = old_policy.source(algo.old_logprobs, algo.minibatches, algo.kl_in_reward, algo.kl_coef)
        old, agreement = {}, None
        if source == old_policy.RECOMPUTE:
            with run.phase("old_logprobs"):
                old = dict(
                    zip(
                        mine,
                        policy.logprobs(
                            seqs, plens, temperature=temp, routes=routes_of(samples, mine, replay)
                        ),
                    )
                )
            # The engine sampled with the version these old log-probs come from: they must agree.
            agreement = compare(
                [samples[i] for i in mine], [old[i] for i in mine], refusals.thresholds.max_gap, newest
            )
        elif source == old_policy.ENGINE:
            old = {i: torch.tensor(samples[i].logprobs, dtype=torch.float32) for i in mine}
        ref = {}
        if reference is not None:
            with run.phase("ref_logprobs"):
                ref = dict(
                    zip(
                        mine,
                        reference.logprobs(
                            seqs, plens, temperature=temp, routes=routes_of(samples, mine, replay)
                        ),
                    )
                )

        # 3. group-relative advantages (the KL folded into the rewards when the recipe says so)
        kl = kl_sums(old, ref, algo.kl_estimator, procs.dp_cpu_group) if algo.kl_in_reward and ref else None
        adv = advantages_with_kl(samples, ro.samples_per_prompt, algo, ro.max_new_tokens, kl)
        keep = loss_mask_keep(samples, algo)

        # 4. k minibatches, one optimizer step each. Without a recompute, the first minibatch's forward
        #    (before any update) gives the engine-vs-trainer agreement of its samples.
        train_metrics = []
        for minibatch in plan:
            idx = minibatch[procs.state.dp_rank]
            everyone = [i for rank_share in minibatch for i in rank_share]
            loss_fn = grpo_loss_fn(
                algo,
                ro.max_new_tokens,
                global_normaliser(samples, everyone, keep, algo.loss_agg),
                old_from_forward=source == old_policy.UPDATE,
            )
            out = policy.train_step(
                [samples[i].sequence for i in idx],
                [samples[i].prompt_len for i in idx],
                loss_fn,
                extras=minibatch_extras(samples, idx, adv, keep, old, ref),
                temperature=temp,
                timer=run.timer,
                return_logprobs=agreement is None,
                routes=routes_of(samples, idx, replay),
            )
            if agreement is None:
                out, forward = out
                agreement = compare([samples[i] for i in idx], forward, refusals.thresholds.max_gap, newest)
            train_metrics.append(out)
        feed.after_train(step)  # asynchronous: the batch the engines drew meanwhile, k steps ahead

        # The agreement compares the tokens of the batch's newest version. Asynchronous (or a batch of carried
        # groups only), that version is older than the trainer's: it then measures that drift too, not only
        # engine/trainer numerics (exact on lag-0 versions).
        agreement["version_lag"] = feed.lag_of(agreement["version"], step)
        # The step's agreement acts as the probe does (rollout.on_logprob_disagreement), over every trainer rank:
        # it cannot unserve the batch it measured, so `refuse` ends the run once max_refused_publications steps
        # in a row disagree, and `stop` ends it now.
        problems = step_problems(agreement, refusals.thresholds, procs.cpu_group)
        halt = refusals.after_step(step, agreement["version"], problems)
        agreement["problems"] = problems
        metrics = step_metrics(samples, stats, agreement, train_metrics, publication, run)
        extra = {"sampling_rounds": rounds, "old_logprobs": source, "version_lag": lag}
        extra["rollout_wait_s"] = feed.take_wait()  # separated: the trainer idle, waiting on the engines
        run.record(step + 1, {**metrics, **extra})
        preempted = preemption.requested()
        checkpointer.poll()
        if halt:  # nothing is saved from a step whose samples disagreed; the last checkpoint stays the newest
            feed.stop(step)
            break
        if components.save_due(save_every, cfg.steps, step + 1, preempted):
            position = feed.task_state(step + 1), step + 1, feed.carry_state(step + 1)
            state = components.run_state(cfg, procs.layout, *position)
            checkpointer.save(step + 1, policy, reference, state)
        if preempted:
            feed.stop(step)
            break

    checkpointer.close()
    if colocated is not None and colocated[4] is not None:
        colocated[4].close()
    run.finish()
    # Every rank finishes its writes before any exits: srun --kill-on-bad-exit stops the others as soon as
    # one rank exits non-zero (EXIT_REQUEUE included).
    torch.distributed.barrier(group=procs.job_cpu_group)
    if halt:
        raise PublicationRefused(halt if procs.is_main else 1)
    return EXIT_REQUEUE if preempted else 0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="megatron-rl train", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", help="a shipped recipe name or a path to a recipe YAML")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. steps=5 optim.lr=1e-5")
    return p.parse_args(argv)


if __name__ == "__main__":
    from megatron_rl.telemetry.console import run_guarded

    sys.exit(run_guarded(main))  # errors reach the terminal while output goes to log.txt
