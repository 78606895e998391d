"""Build the policy (with optimizer) and the frozen reference from a recipe, at the recipe's layout."""

from __future__ import annotations

import torch

from megatron_rl.trainer.hf_import import load_hf_into
from megatron_rl.trainer.parallel import ParallelState
from megatron_rl.trainer.policy import OptimSettings, Policy


def optim_settings(recipe) -> OptimSettings:
    """The recipe's `optim` group in the trainer's units: the recipe counts warm-up and the run in RL
    steps, the trainer's scheduler in optimizer steps, of which each RL step takes
    `algorithm.minibatches`."""
    o, per_step = recipe.optim, recipe.algorithm.minibatches
    return OptimSettings(
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        distributed_optimizer=o.distributed_optimizer,
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
