"""Saving: sharded model + optimizer through megatron-core dist-checkpointing, asynchronously.

All ranks call `Checkpointer.save(step)` at the same step boundary. Each rank writes its own
shards; the `COMPLETE` marker is written by rank 0 only after every rank's writes have finished
(for an async save, in the finalize step that megatron-core runs once all ranks report done), so a
checkpoint interrupted at any point -- a kill -9 in the middle of a save included -- has no marker
and is never loaded.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.checkpoint.state import rng_state
from megatron_rl.checkpoint.store import MARKER, prune, step_dir

log = logging.getLogger(__name__)
FORMAT = {"distrib_optim_sharding_type": "fully_reshardable"}


def prime_optimizer_state(optimizer) -> None:
    """Give a fresh torch Adam its state entries (zeros, step 0) so a checkpoint can be loaded into it.

    Without apex or transformer-engine (the CPU case), megatron-core's DistributedOptimizer.state_dict
    reads a `step` entry from every parameter's torch-optimizer state, which torch creates only at the
    first step; its own `init_state_fn` adds the moments but not `step`. Loading before any step (a
    resume) therefore needs this. With apex/TE (GPU clusters) megatron-core keeps `step` elsewhere and
    this does nothing.
    """
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True):
        return
    for chained in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = chained.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p.data)
                    st["exp_avg_sq"] = torch.zeros_like(p.data)
                    st["step"] = torch.tensor(0.0)


def sharded_state(policy, reference=None, loading: bool = False) -> dict:
    """The dist-checkpointing state dict: model, optimizer (model-space sharding: any layout can load it)
    and, with a KL term, the frozen reference (it must stay the *initial* policy across resumes)."""
    model_sd = policy.model.sharded_state_dict()
    state = {"model": model_sd}
    if policy.optimizer is not None:
        if loading:
            prime_optimizer_state(policy.optimizer)
        state["optimizer"] = policy.optimizer.sharded_state_dict(
            model_sd, is_loading=loading, metadata=FORMAT
        )
    if reference is not None:
        state["reference"] = reference.model.sharded_state_dict(prefix="reference.")
    return state


class Checkpointer:
    def __init__(self, root: Path, run, keep_last: int = 2, keep_every: int = 0, async_save: bool = True):
        self.root, self.run = root, run
        self.keep_last, self.keep_every, self.async_save = keep_last, keep_every, async_save
        self._queue = None
        self.last_save: dict[str, float] = {}
        if async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self._queue = AsyncCallsQueue()

    def save(self, step: int, policy, reference, run_state: dict) -> Path:
        from megatron.core import dist_checkpointing

        self.wait()  # at most one save in flight
        t0 = time.perf_counter()
        path = step_dir(self.root, step)
        if self.run.is_main:
            (path / "dist").mkdir(parents=True, exist_ok=True)  # dist-checkpointing wants it to exist, empty
            (path / "run_state.json").write_text(json.dumps(run_state, indent=1))
        dist.barrier()
        torch.save(rng_state(), path / f"rank_{self.run.rank:05d}.pt")
        request = dist_checkpointing.save(
            sharded_state(policy, reference),
            str(path / "dist"),
            async_sharded_save=self.async_save,
            content_metadata=FORMAT,
        )
        nbytes = sum(p.numel() * p.element_size() for p in policy.model.parameters())
        if self.async_save:
            request.add_finalize_fn(lambda: self._complete(path, step, t0))
            self._queue.schedule_async_request(request)
        else:
            dist.barrier()
            self._complete(path, step, t0)
        self.last_save = {"step": step, "blocking_s": time.perf_counter() - t0, "local_param_bytes": nbytes}
        return path

    def _complete(self, path: Path, step: int, t0: float) -> None:
        """Runs on every rank once all ranks' shards are written; rank 0 writes the marker and prunes."""
        if self.run.is_main:
            (path / MARKER).write_text(json.dumps({"step": step, "seconds": time.perf_counter() - t0}))
            removed = prune(self.root, self.keep_last, self.keep_every)
            log.info(
                "checkpoint %s complete in %.2f s%s",
                path,
                time.perf_counter() - t0,
                f" (pruned {len(removed)})" if removed else "",
            )

    def poll(self) -> None:
        """Finalise an async save if every rank has finished writing (cheap; call once per step)."""
        if self._queue is not None:
            self._queue.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        if self._queue is not None:
            self._queue.maybe_finalize_async_calls(blocking=True)

    def close(self) -> None:
        self.wait()
        if self._queue is not None:
            self._queue.close()
