"""Resuming: the newest complete checkpoint, loaded at this run's layout (which may differ from the
saved one: dist-checkpointing reshards model and optimizer)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.checkpoint.save import sharded_state
from megatron_rl.checkpoint.state import set_rng_state
from megatron_rl.checkpoint.store import is_complete, newest_complete

log = logging.getLogger(__name__)


def find(resume: str, root: Path) -> Path | None:
    """What `checkpoint.resume` points at: auto (newest complete under root), none, or a path."""
    if resume == "none":
        return None
    if resume == "auto":
        found = newest_complete(root)
        return found[1] if found else None
    path = Path(resume)
    if not is_complete(path):
        raise SystemExit(
            f"checkpoint.resume={resume}: not a complete checkpoint (no COMPLETE marker in {path})"
        )
    return path


def load(path: Path, run, policy, reference, task) -> dict:
    """Load model, optimizer, reference, this rank's RNG and the run state. Returns the run state."""
    from megatron.core import dist_checkpointing

    target = sharded_state(policy, reference, loading=True)
    state = dist_checkpointing.load(target, str(path / "dist"))
    policy.model.load_state_dict(state["model"])
    if policy.optimizer is not None and "optimizer" in state:
        policy.optimizer.load_state_dict(state["optimizer"])
    if reference is not None:
        ref = {k.removeprefix("reference."): v for k, v in state["reference"].items()}
        reference.model.load_state_dict(ref)
    run_state = json.loads((path / "run_state.json").read_text())
    rank_file = path / f"rank_{run.rank:05d}.pt"
    if run_state.get("world_size") == dist.get_world_size() and rank_file.exists():
        set_rng_state(torch.load(rank_file, weights_only=False))
    else:
        log.warning(
            "resuming at another world size (%s -> %s): per-rank RNG states are not restored",
            run_state.get("world_size"),
            dist.get_world_size(),
        )
    task.load_state(run_state["task"])
    return run_state
