"""GRPO and PPO, top to bottom. One process per GPU (torchrun or srun); every rank runs this same file.

    torchrun --nproc-per-node 2 -m megatron_rl.train grpo_tiny_cpu [overrides...]

Each step:
  1. generate n samples per prompt with the published policy; every finished sample is scored at
     once in the sandboxed reward pool, while the engine keeps generating;
  2. old-policy log-probs (before the first update; they also check the engine's log-probs) and
     reference log-probs (frozen copy; skipped when the KL coefficient is 0); synchronous, these run
     as soon as generation ends, while the reward pool scores its last samples (step 3 waits for them);
  3. group-relative advantages (per prompt, over its n samples); with PPO (algorithm.name=ppo) the
     critic's values and per-token advantages by GAE instead (loop/step/ppo.py);
  4. k minibatches, one optimizer step each (algorithm.epochs passes): clipped surrogate + KL to the
     reference; with PPO, the critic's clipped value loss too, by its own optimizer;
  5. publish (at the top of the next step, as the device passes back to the engine): reshard the
     trainer's shards into the engines' layout, in memory; stage, validate, activate.

A learned reward model (reward.model_checkpoint) scores every sample after generation, on the trainer's
devices, and its score joins the verifier's in the reward (a weighted sum).

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
from megatron_rl.check.seal import sealed
from megatron_rl.checkpoint.preempt import Preemption
from megatron_rl.config.load import load_recipe
from megatron_rl.loop.placement import engine_pool
from megatron_rl.loop.placement.probe import step_problems
from megatron_rl.loop.placement.publication import PublicationRefused
from megatron_rl.loop.record.start import seed_everything, start_run
from megatron_rl.loop.record.summary import step_metrics
from megatron_rl.loop.step import components, ppo
from megatron_rl.loop.step.rl_batch import (
    advantages_with_kl,
    assign,
    engine_logprobs,
    global_normaliser,
    grpo_loss_fn,
    kl_sums,
    loss_mask_keep,
    minibatch_extras,
    mismatch_message,
    scored,
    share_agreement,
    tokens_exact,
)
from megatron_rl.system.device import require_device
from megatron_rl.system.failover import EXIT_REQUEUE
from megatron_rl.trainer.build import (
    build_critic,
    build_policy,
    build_reward_model,
    critic_epochs,
    frozen_copy,
)
from megatron_rl.trainer.replay import routes_of


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    # `validate`'s check, before anything; it resolves the recipe once into what every part reads
    # (the layout, the model's spec, the sampling with its end ids...: run/resolve.py). The problem set,
    # read through the tokenizer, it reads only where the launcher did not (the launcher's seal: check/seal.py)
    recipe = load_recipe(args.recipe, args.overrides)
    run = validate_recipe(recipe, read_data=not sealed(recipe))
    require_device(run.recipe.cluster)  # a GPU cluster where CUDA is unavailable: one line and exit 2
    cfg, algo, ro = run.recipe, run.recipe.algorithm, run.recipe.rollout
    seed_everything(cfg.seed)
    procs, log = start_run(run)  # the process groups; the run's records, console and sinks
    problems = components.read_problems(run, procs)  # read by job rank 0, shared with every rank

    if not procs.is_trainer:  # an engine rank of a separated job (loop/placement/pools.py)
        return engine_pool.serve(run, procs, log, problems)

    # ---- setup: trainer, reference, engines, reward pool, publisher, checkpoints ----
    with log.phase("init"):
        policy = build_policy(run, procs.state, with_optimizer=True)
        reference = frozen_copy(policy, run, procs.state) if algo.kl_coef > 0 else None
        # PPO: the critic, a value model trained beside the policy; a learned reward model, frozen, on the
        # host between its uses
        critic = build_critic(run, procs.state, policy) if algo.name == "ppo" else None
        if critic is not None and critic.state.groups is not None:  # critic.tp/pp: a layout of its own
            log.say(ppo.own_layout_line(critic, procs.state))
        reward_model = build_reward_model(run, procs.state) if run.reward_spec is not None else None
        # Colocated: this rank's engine and reward pool, time-sharing the device with the trainer
        side = components.build_colocated(run, procs, log, policy, reference, critic, problems)
        engine = side.engine if side is not None else None
        task = components.build_task(run, problems)
        publisher = components.build_publisher(run, procs, engine)
        refusals = components.build_refusals(run, publisher)  # what a refused or disagreeing version does
        prober = components.build_prober(run, procs, log.timer, policy=policy, engine=engine)
        checkpointer = components.build_checkpointer(run, procs, log.name)
        save_every = components.checkpoint_interval(run)
        # 0 unless a checkpoint is found; with partial rollouts, the groups it carried into its next batch
        start, carried = components.resume(run, procs, log, policy, reference, task, critic)
        preemption = Preemption(procs.cpu_group)
    publisher.next_version = start + 1  # step s samples from version s + 1 (at most k older when async)
    feed = components.build_feed(run, procs, log, policy, task, refusals, start, carried, prober, side)
    temp = components.trainer_temperature(ro)  # trainer log-probs follow the engine's convention
    if start >= cfg.steps:
        log.say(
            f"nothing to do: run {log.name} already reached step {start} (steps={cfg.steps}); raise steps=, "
            "or start afresh with checkpoint.resume=none and another MEGATRON_RL_RUN_NAME"
        )
    log.start_progress(start)
    preempted, halt = False, ""

    for step in range(start, cfg.steps):
        # 0. publish: colocated, hand the device to the engine (the trainer offloads, the engine wakes, the
        #    policy lands); separated, send it to the engine pool. Before it serves, the engines and the trainer
        #    score a fixed probe: a version whose log-probs disagree (a conversion bug the checksums cannot
        #    see) is refused like one whose bytes failed. A refused version never serves: the previous one
        #    keeps serving (RefusalPolicy). Asynchronous, the engines already drew this step's batch.
        with log.phase("publish"):
            publication = feed.publish(step)

        # 1. generate and score (streamed; separated: on the engine ranks), then every rank sees every sample;
        #    synchronous, the batch comes when generation ends, the reward pool still scoring its last samples
        samples, stats, rounds = feed.batch(step)
        lag = feed.lag(samples, step)  # 0 when synchronous; at most rollout.max_staleness when async
        newest = max(
            (v for s in samples for v in s.versions), default=-1
        )  # the agreement compares its tokens

        # the engine sampled with the version the trainer's log-probs below come from: they must agree
        agreement_of = partial(share_agreement, samples, run.thresholds.max_gap, newest)

        # 2. old-policy and reference log-probs of this DP rank's samples, before any update. The old ones
        #    are recomputed, or (algorithm.old_logprobs) taken from the engines, or, with one minibatch,
        #    from the update's own forward, which runs on the same weights (algorithms/old_policy.py).
        #    algorithm.routing_replay: every forward uses the experts the engine routed each token to.
        plan = assign(len(samples), procs.state.dp, algo.minibatches, cfg.seed, step)
        mine = sorted(i for minibatch in plan for i in minibatch[procs.state.dp_rank])
        # Token in, token out: the ids this rank scores and trains on must be those its engines ran and
        # produced, turn by turn (a re-encoded turn would train on text the policy never wrote). Checked
        # over every trainer rank before anything uses them; a mismatch ends the run before the update.
        trained = {i: samples[i].sequence for i in mine}
        exact = tokens_exact(samples, trained, procs.cpu_group)
        if not exact:
            raise RuntimeError(mismatch_message(step + 1, samples, trained))
        # A learned reward model scores this rank's samples; every rank receives every score
        if reward_model is not None:
            with log.phase("reward_model"):
                scores = ppo.reward_model_scores(reward_model, samples, mine, procs.dp_cpu_group)
        replay = algo.routing_replay
        # PPO's first critic.critic_only_steps train only the critic; the policy's agreement then needs a forward
        train_policy = critic is None or step >= cfg.critic.critic_only_steps
        source = old_policy.source(
            algo.old_logprobs, algo.minibatches, algo.kl_in_reward, algo.kl_coef, algo.epochs
        )
        old, ref, agreement, values = {}, {}, None, {}
        if source == old_policy.RECOMPUTE:
            with log.phase("old_logprobs"):
                old = scored(policy, samples, mine, temp, replay)
            agreement = agreement_of(mine, [old[i] for i in mine])
        elif source == old_policy.ENGINE:
            old = engine_logprobs(samples, mine)
        if reference is not None:
            with log.phase("ref_logprobs"):
                ref = scored(reference, samples, mine, temp, replay)

        # PPO: the critic's values of this rank's samples (it scores its own share at a layout of its own)
        if critic is not None:
            with log.phase("critic_values"):
                values = ppo.critic_values(critic, samples, mine, procs.cpu_group)

        # 3. the rewards: the forwards above ran while the reward pool scored (synchronous runs); its last
        #    results arrive now, and with a reward model, each reward is the recipe's weighted sum of the
        #    model's score and the verifier's.
        feed.rewards()
        if reward_model is not None:
            ppo.combine_rewards(samples, scores, cfg.reward)

        # 4. advantages (the KL folded into the rewards when the recipe says so). GRPO: group-relative, over
        #    whole trajectories (a multi-turn sample is one trajectory with one reward: rollout/turns.py).
        #    PPO: GAE per token over the critic's values (loop/step/ppo.py).
        returns, ppo_metrics = {}, {}
        if critic is None:
            kl = (
                kl_sums(old, ref, algo.kl_estimator, procs.dp_cpu_group, samples)
                if algo.kl_in_reward and ref
                else None
            )
            adv = advantages_with_kl(
                samples, ro.samples_per_prompt, algo, ro.max_new_tokens, kl, ro.turn_penalty
            )
        else:
            kl = ppo.token_kl(old, ref, algo.kl_estimator) if algo.kl_in_reward and ref else None
            adv, returns, ppo_metrics = ppo.advantages(
                samples, mine, values, algo, ro.max_new_tokens, ro.turn_penalty, kl, procs.dp_cpu_group
            )
            returns = ppo.critic_targets(critic, returns, procs.cpu_group)
        keep = loss_mask_keep(samples, algo)

        # 5. k minibatches, one optimizer step each. Without a recompute, the first minibatch's forward
        #    (before any update) gives the engine-vs-trainer agreement of its samples. The loss covers the
        #    tokens the model generated; a multi-turn trajectory's observations are context (minibatch_extras).
        #    PPO: the critic takes an optimizer step of its own on each minibatch, on the same tokens, for
        #    critic.epochs passes (the policy's by default).
        train_metrics, critic_outs = [], []
        passes = max(algo.epochs, critic_epochs(cfg) if critic is not None else 0)
        for epoch, minibatch in [(e, mb) for e in range(passes) for mb in plan]:
            idx = minibatch[procs.state.dp_rank]
            everyone = [i for rank_share in minibatch for i in rank_share]
            normaliser = global_normaliser(samples, everyone, keep, algo.loss_agg)
            prompt_lens = [samples[i].prompt_len for i in idx]
            if train_policy and epoch < algo.epochs:
                loss_fn = grpo_loss_fn(algo, ro.max_new_tokens, normaliser, source == old_policy.UPDATE)
                out = policy.train_step(
                    [trained[i] for i in idx],
                    prompt_lens,
                    loss_fn,
                    extras=minibatch_extras(samples, idx, adv, keep, old, ref),
                    temperature=temp,
                    timer=log.timer,
                    return_logprobs=agreement is None,
                    routes=routes_of(samples, idx, replay),
                )
                if agreement is None:
                    out, forward = out
                    agreement = agreement_of(idx, forward)
                train_metrics.append(out)
            if critic is not None and epoch < critic_epochs(cfg):
                share = ppo.critic_share(critic, everyone, idx)
                with log.phase("critic_train"):
                    critic_outs.append(
                        critic.train_step(
                            [samples[i].sequence for i in share],
                            [samples[i].prompt_len for i in share],
                            ppo.value_loss_fn(algo, ro.max_new_tokens, normaliser),
                            extras=ppo.critic_extras(samples, share, keep, values, returns),
                        )
                    )
        if agreement is None:  # PPO's critic-only steps: the policy did not train, one forward for the check
            with log.phase("old_logprobs"):
                forward = scored(policy, samples, mine, temp, replay)
            agreement = agreement_of(mine, [forward[i] for i in mine])
        feed.after_train(step)  # asynchronous: the batch the engines drew meanwhile, k steps ahead

        # The agreement compares the tokens of the batch's newest version. Asynchronous (or a batch of carried
        # groups only), that version is older than the trainer's: it then measures that drift too, not only
        # engine/trainer numerics (exact on lag-0 versions). It acts as the probe does, over every trainer
        # rank: it cannot unserve the batch it measured, so `refuse` ends the run once
        # max_refused_publications steps in a row disagree, and `stop` ends it now.
        agreement["version_lag"] = feed.lag_of(agreement["version"], step)
        agreement["problems"] = step_problems(agreement, run.thresholds, procs.cpu_group)
        halt = refusals.after_step(step, agreement["version"], agreement["problems"])
        metrics = step_metrics(samples, stats, agreement, train_metrics, publication, log, run.spec, exact)
        extra = {"sampling_rounds": rounds, "old_logprobs": source, "version_lag": lag}
        # PPO: the critic's value loss and clip fraction, of whole minibatches as the policy's train metrics
        if critic is not None:
            extra.update(ppo.critic_metrics(critic_outs))
        extra.update(ppo_metrics, **ppo.model_score_metrics(samples))
        extra["rollout_wait_s"] = feed.take_wait()  # separated: the trainer idle, waiting on the engines
        log.record(step + 1, {**metrics, **extra}, samples, task)  # and a few samples to read (samples.jsonl)
        preempted = preemption.requested()
        checkpointer.poll()
        if halt:  # nothing is saved from a step whose samples disagreed; the last checkpoint stays the newest
            feed.stop(step)
            break
        if components.save_due(save_every, cfg.steps, step + 1, preempted):
            position = feed.task_state(step + 1), step + 1, feed.carry_state(step + 1)
            state = components.run_state(run, *position, log.identity())  # identity: its name and W&B run
            checkpointer.save(step + 1, policy, reference, state, critic)
        if preempted:
            feed.stop(step)
            break

    checkpointer.close()
    feed.close()
    log.finish()
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
    import os

    from megatron_rl.system.failover import EXIT_NODE_FAULT, EXIT_PEER_LOST, exit_code_for
    from megatron_rl.telemetry.console import run_guarded

    # Errors reach the terminal while output goes to log.txt; a lost peer or a crashed engine exits with the
    # code slurm/train.sbatch's failover reads (system/failover.py)
    code = run_guarded(main, exit_code_for)
    if code in (EXIT_PEER_LOST, EXIT_NODE_FAULT):
        # At once: the interpreter's clean-ups (the checkpointer's writer, process groups, the engine) would
        # wait on the lost peer until the launcher's kill (Slurm's KillWait, 30 s by default), and the job's
        # failover waits on this exit. The launcher ends what this rank started.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
