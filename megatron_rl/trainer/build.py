"""Build the policy (with optimizer), the frozen reference, PPO's critic and a learned reward model from a
recipe, at the recipe's layout."""

from __future__ import annotations

import torch

from megatron_rl.trainer.hf_import import load_hf_into
from megatron_rl.trainer.parallel import ParallelState
from megatron_rl.trainer.policy import OptimSettings, Policy
from megatron_rl.trainer.value import HEAD_PARAM


def optimizer_steps_per_step(recipe, critic: bool = False) -> int:
    """Optimizer steps one RL step takes: one per minibatch, per pass (`algorithm.epochs`; the critic's
    `critic.epochs` when set)."""
    a = recipe.algorithm
    return a.minibatches * (critic_epochs(recipe) if critic else a.epochs)


def critic_epochs(recipe) -> int:
    """The critic's passes over a step's minibatches: `critic.epochs`, or the policy's when 0."""
    return recipe.critic.epochs or recipe.algorithm.epochs


def optim_settings(recipe, group=None) -> OptimSettings:
    """The recipe's `optim` group (or the critic's, `group=recipe.critic`) in the trainer's units: the recipe
    counts warm-up and the run in RL steps, the trainer's scheduler in optimizer steps, of which each RL
    step takes `algorithm.minibatches` x the passes (`optimizer_steps_per_step`)."""
    critic = group is not None and group is recipe.critic
    o, per_step = group or recipe.optim, optimizer_steps_per_step(recipe, critic)
    return OptimSettings(
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        distributed_optimizer=recipe.optim.distributed_optimizer,
        lr_schedule=o.lr_schedule,
        warmup_steps=o.warmup_steps * per_step,
        decay_steps=recipe.steps * per_step,
    )


def build_policy(
    run, state: ParallelState, with_optimizer: bool = True, import_weights: bool = True
) -> Policy:
    """The trainer's policy at the run's layout (`run`: the resolved run, run/resolve.py, whose spec is
    the model's): HF weights when `model.hf_checkpoint` is set, megatron-core's seeded initialisation
    otherwise (the tiny recipe trains from scratch). `import_weights=False` skips the HF read when a
    checkpoint of our own fills the model next."""
    recipe, spec = run.recipe, run.spec
    policy = Policy(
        spec,
        state,
        optim=optim_settings(recipe) if with_optimizer else None,
        micro_batch_size=recipe.optim.micro_batch_size,
        routing_replay=recipe.algorithm.routing_replay,
    )
    if recipe.model.hf_checkpoint and import_weights:
        load_hf_into(
            policy.model,
            spec,
            recipe.model.hf_checkpoint,
            state.tp,
            state.tp_rank,
            policy.padded_vocab,
            etp=state.layout.etp,
            etp_rank=state.expert_coord.etp,
        )
        policy.weights_written()  # the optimizer's main copy was of the initialisation
    return policy


def frozen_copy(policy: Policy, run, state: ParallelState) -> Policy:
    """The reference: same layout, same weights as `policy` now, no optimizer, never updated.

    With `algorithm.reference=offload` its weights wait in host memory and come to the device only
    for the reference log-probs (the planner counts the choice: plan/memory.py)."""
    recipe = run.recipe
    ref = Policy(
        policy.spec,
        state,
        micro_batch_size=recipe.optim.micro_batch_size,
        routing_replay=recipe.algorithm.routing_replay,
    )
    src = dict(policy.named_parameters_global())
    with torch.no_grad():
        for name, p in ref.named_parameters_global():
            p.copy_(src[name])
            p.requires_grad_(False)
    if recipe.algorithm.reference == "offload":
        ref.offload_between_uses = True
        ref.weights_to_host()
    return ref


def build_critic(run, state: ParallelState, policy: Policy) -> Policy:
    """PPO's critic (`critic` group): a value model (trainer/value.py) with its own AdamW and LR schedule, its
    own micro-batch size and recompute, on the trainer's ranks at the trainer's layout or at its own
    (critic.tp, critic.pp: megatron-core groups of its own, trainer/model_groups.py). `critic.init=policy`:
    the policy's weights now (its LM head left out; the value head starts at zero), resharded when the
    layouts differ; else an HF sequence-classification checkpoint (a reward model), its score head included."""
    recipe, c = run.recipe, run.recipe.critic
    own = state.layout.for_model(c.tp, c.pp)
    if own is not state.layout:
        from megatron_rl.trainer.model_groups import state_at

        state = state_at(state, own, recipe.cluster.dist_timeout_s)
    layout = state.layout.with_(recompute=c.recompute) if c.recompute else None
    critic = Policy(
        run.critic_spec,
        state,
        optim=optim_settings(recipe, c),
        micro_batch_size=c.micro_batch_size or recipe.optim.micro_batch_size,
        head="value",
        layout=layout,
    )
    if c.init == "policy" and state.groups is not None:
        from megatron_rl.trainer.model_groups import copy_weights

        copy_weights(policy, critic, skip=(HEAD_PARAM,))
    elif c.init == "policy":
        src = dict(policy.named_parameters_global())
        with torch.no_grad():
            for name, p in critic.named_parameters_global():
                if name != HEAD_PARAM:  # every parameter but the head, which starts at zero
                    p.copy_(src[name])
    else:
        load_value_model(critic, c.init, state)
    critic.weights_written()  # the optimizer's main copy was of the initialisation
    return critic


def build_reward_model(run, state: ParallelState) -> Policy:
    """The learned reward model (`reward.model_checkpoint`): a frozen value model whose score is its value
    after the last token, in host memory between uses (like an offloaded reference)."""
    recipe = run.recipe
    rm = Policy(run.reward_spec, state, micro_batch_size=recipe.optim.micro_batch_size, head="value")
    load_value_model(rm, recipe.reward.model_checkpoint, state)
    for p in rm.model.parameters():
        p.requires_grad_(False)
    rm.offload_between_uses = True
    rm.weights_to_host()
    return rm


def load_value_model(model: Policy, hf_dir: str, state: ParallelState) -> None:
    """An HF `*ForSequenceClassification` checkpoint into a value model, at its TP shard."""
    load_hf_into(
        model.model,
        model.spec,
        hf_dir,
        state.tp,
        state.tp_rank,
        model.padded_vocab,
        etp=state.layout.etp,
        etp_rank=state.expert_coord.etp,
        value_head=True,
    )
