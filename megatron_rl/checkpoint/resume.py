"""Resuming: the newest checkpoint that verifies, loaded at this run's layout (which may differ from the
saved one: dist-checkpointing reshards model and optimizer).

A checkpoint is loaded only if every file matches its manifest (integrity.py). With
`checkpoint.resume=auto` the newest that verifies is taken and each newer one skipped is named with
its problems; an explicit path that does not verify is refused. Every rank re-hashes a share of the
files, so verifying costs one read of the checkpoint spread over the job.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch.distributed as dist

from megatron_rl.checkpoint.integrity import verify
from megatron_rl.checkpoint.save import CRITIC_SCHEDULER_KEY, SCHEDULER_KEY, sharded_state, unshare_adam_steps
from megatron_rl.checkpoint.state import load_rng_state, set_rng_state
from megatron_rl.checkpoint.store import list_checkpoints, recover

log = logging.getLogger(__name__)


def verify_shared(path: Path, cpu_group=None) -> list[str]:
    """verify(path) with the re-hashing split over the ranks of `cpu_group` (a gloo group over every rank;
    collective when distributed): the problems are host objects."""
    if not (dist.is_available() and dist.is_initialized()):
        return verify(path)
    rank, world = dist.get_rank(cpu_group), dist.get_world_size(cpu_group)
    every: list[list[str] | None] = [None] * world
    dist.all_gather_object(every, verify(path, share=(rank, world)), group=cpu_group)
    return list(dict.fromkeys(p for ps in every for p in ps or []))


def find(resume: str, root: Path, cpu_group=None) -> Path | None:
    """What `checkpoint.resume` points at: auto (the newest that verifies under root), none, or a path.

    Collective when distributed: call it on every rank of `cpu_group` (gloo, every rank of the trainer)."""
    if resume == "none":
        return None
    main = not dist.is_initialized() or dist.get_rank() == 0
    if resume == "auto":
        if main:
            recover(root)  # a sealed save that a crash left under its temporary name
        if dist.is_initialized():
            dist.barrier(group=cpu_group)
        skipped = 0
        for _step, path in reversed(list_checkpoints(root)):
            problems = verify_shared(path, cpu_group)
            if not problems:
                if skipped and main:
                    log.warning("resuming from %s, the newest checkpoint that verifies", path)
                return path
            skipped += 1
            if main:
                log.warning(
                    "skipping checkpoint %s: %s%s",
                    path,
                    "; ".join(problems[:5]),
                    f" (+{len(problems) - 5} more)" if len(problems) > 5 else "",
                )
        if skipped and main:
            log.warning("no checkpoint under %s verifies: starting from step 0", root)
        return None
    path = Path(resume)
    problems = verify_shared(path, cpu_group)
    if problems:
        raise SystemExit(
            f"checkpoint.resume={resume}: the checkpoint does not verify:\n  "
            + "\n  ".join(problems[:10])
            + f"\n(`megatron-rl ckpt verify {path}` lists every problem; checkpoint.resume=auto takes the "
            "newest checkpoint that verifies)"
        )
    return path


def load(path: Path, rank: int, policy, reference, task, critic=None) -> dict:
    """Load model, optimizer, reference, PPO's critic (model, optimizer, schedule), the RNG of this `rank` and
    the run state. Returns the run state.

    `path` must have been verified (`find` does it): DCP unpickles `dist/.metadata` (integrity.py)."""
    from megatron.core import dist_checkpointing

    run_state = json.loads((path / "run_state.json").read_text())
    if critic is not None and not run_state.get("critic", False):
        raise ValueError(
            f"{path} was saved by a run without a critic (algorithm.name={run_state.get('algorithm', 'grpo')}); "
            "a PPO run cannot resume it: start afresh with checkpoint.resume=none, or resume it with its own recipe"
        )
    target = sharded_state(policy, reference, loading=True, critic=critic)
    state = dist_checkpointing.load(target, str(path / "dist"))
    policy.model.load_state_dict(state["model"])
    if policy.optimizer is not None and "optimizer" in state:
        policy.optimizer.load_state_dict(state["optimizer"])
        unshare_adam_steps(policy.optimizer)
    if policy.scheduler is not None:
        load_schedule(policy.scheduler, state.get(SCHEDULER_KEY), path)
    if reference is not None:
        ref = {k.removeprefix("reference."): v for k, v in state["reference"].items()}
        reference.model.load_state_dict(ref)
    if critic is not None:
        critic.model.load_state_dict({k.removeprefix("critic."): v for k, v in state["critic"].items()})
        critic.optimizer.load_state_dict(state["critic_optimizer"])
        unshare_adam_steps(critic.optimizer)
        load_schedule(critic.scheduler, state.get(CRITIC_SCHEDULER_KEY), path)
    rank_file = path / f"rank_{rank:05d}.pt"
    if run_state.get("world_size") == dist.get_world_size() and rank_file.exists():
        set_rng_state(load_rng_state(rank_file))
    else:
        log.warning(
            "resuming at another world size (%s -> %s): per-rank RNG states are not restored",
            run_state.get("world_size"),
            dist.get_world_size(),
        )
    task.load_state(run_state["task"])
    return run_state


def load_schedule(scheduler, saved: dict | None, path: Path) -> None:
    """Continue the LR schedule where the checkpoint left it: its count of optimizer steps taken.

    The scheduler is built with `override_opt_param_scheduler` (trainer/policy.py), so the recipe's lr,
    warm-up and length win over the saved ones; megatron-core's `load_state_dict` *adds* the saved count
    to the current one, which is therefore reset first (a policy may have stepped before loading)."""
    if saved is None:
        log.warning(
            "checkpoint %s holds no LR scheduler state: the LR schedule restarts from its start", path
        )
        return
    scheduler.num_steps = 0
    scheduler.load_state_dict(saved)
