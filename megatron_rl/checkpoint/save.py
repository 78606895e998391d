"""Saving: sharded model + optimizer through megatron-core dist-checkpointing, asynchronously, verified.

All ranks call `Checkpointer.save(step)` at the same step boundary:
1. refuse a save that cannot fit on its disk (bytes to write, summed over ranks, vs free space);
2. write into a fresh `step_N.partial/` (store.py): each rank its shards and RNG file;
3. each rank hashes the files it wrote -- for an async save in the background writer, right after
   its writes, so checksums add nothing to the time training is blocked -- into `sums_rank_R.json`;
4. once every rank has finished (megatron-core's finalize step), rank 0 writes `MANIFEST.json` (every
   file's size and digest), then the `COMPLETE` marker, then renames the directory to `step_N/`
   and prunes. A save interrupted at any point -- a kill -9 included -- leaves no `step_N/`.
A full disk, however the writer reports it, becomes a `NoSpaceError` naming the directory and the
bytes needed.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.checkpoint.integrity import (
    NoSpaceError,
    ensure_space,
    is_disk_full,
    write_manifest,
    write_sums,
    write_text,
)
from megatron_rl.checkpoint.state import rng_state
from megatron_rl.checkpoint.store import MARKER, partial_dir, prune, replace_into_place, step_dir

log = logging.getLogger(__name__)
FORMAT = {"distrib_optim_sharding_type": "fully_reshardable"}
SCHEDULER_KEY = "opt_param_scheduler"  # megatron-core's own name for it
CRITIC_SCHEDULER_KEY = "critic_opt_param_scheduler"


def prime_optimizer_state(optimizer) -> None:
    """Give a fresh torch Adam its state entries (zeros, step 0) so a checkpoint can be loaded into it, or
    saved from it before its first step (what that step would start from anyway). Entries already there
    are kept.

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


def unshare_adam_steps(optimizer) -> None:
    """Give every parameter its own Adam `step` tensor after a checkpoint load.

    Without apex or transformer-engine, megatron-core's DistributedOptimizer.load_state_dict puts one
    and the same `step` tensor into every parameter's torch-Adam state; torch's Adam increments each
    parameter's step in place, so the shared tensor advanced once per parameter per update and the
    bias correction of every update after a resume was wrong (the resumed run left the uninterrupted
    one at its first optimizer step). With apex/TE the step lives elsewhere and this does nothing.
    """
    from megatron.core.optimizer import distrib_optimizer

    if getattr(distrib_optimizer, "HAVE_APEX_OR_TE", True):
        return
    for chained in getattr(optimizer, "chained_optimizers", [optimizer]):
        for st in chained.optimizer.state.values():
            if isinstance(st.get("step"), torch.Tensor):
                st["step"] = st["step"].clone()


def sharded_state(policy, reference=None, loading: bool = False, critic=None) -> dict:
    """The dist-checkpointing state dict: model, optimizer (model-space sharding: any layout can load it),
    the LR scheduler's state, with a KL term the frozen reference (it must stay the *initial* policy across
    resumes), and with PPO the critic's model, optimizer and scheduler under `critic.` names.

    The scheduler's state is a few numbers, the same on every rank: dist-checkpointing writes such
    plain values once, into `dist/common.pt`, and `load` returns them whatever the target holds
    (megatron-core's own training keeps `opt_param_scheduler` in that common state too)."""
    model_sd = policy.model.sharded_state_dict()
    state = {"model": model_sd}
    if policy.optimizer is not None:
        # loading, or saving before the optimizer's first step (PPO's critic-only steps): Adam's empty state
        prime_optimizer_state(policy.optimizer)
        state["optimizer"] = policy.optimizer.sharded_state_dict(
            model_sd, is_loading=loading, metadata=FORMAT
        )
    if policy.scheduler is not None and not loading:
        state[SCHEDULER_KEY] = policy.scheduler.state_dict()
    if reference is not None:
        state["reference"] = reference.model.sharded_state_dict(prefix="reference.")
    if critic is not None:
        # a critic at its own layout (trainer/model_groups.py) names its own DP group: megatron-core would
        # take the trainer's to decide which copy of each shard is the one written
        own = {"dp_cp_group": critic.state.groups.dp} if critic.state.groups is not None else {}
        critic_sd = critic.model.sharded_state_dict(prefix="critic.", metadata=own or None)
        state["critic"] = critic_sd
        prime_optimizer_state(critic.optimizer)
        state["critic_optimizer"] = critic.optimizer.sharded_state_dict(
            critic_sd, is_loading=loading, metadata={**FORMAT, **own}
        )
        if not loading:
            state[CRITIC_SCHEDULER_KEY] = critic.scheduler.state_dict()
    return state


def bytes_to_write(state: dict) -> int:
    """Bytes this rank's part of a save writes: its main-replica tensors (replicas are written once)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory, is_main_replica

    total = 0
    for v in nested_values(state):
        if isinstance(v, ShardedTensor | ShardedTensorFactory):
            data = v.data
            if isinstance(data, torch.Tensor) and is_main_replica(v.replica_id):
                total += data.numel() * data.element_size()
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


def _then_write_sums(write: Callable | None, ckpt: Path, rank: int, files: Callable[[], list[Path]]):
    """The background writer's function, followed by hashing what it wrote (still in the page cache)."""

    def run(*args, **kwargs):
        if write is not None:
            write(*args, **kwargs)
        write_sums(ckpt, rank, files())

    return run


class Checkpointer:
    def __init__(
        self,
        root: Path,
        procs,
        keep_last: int = 2,
        keep_every: int = 0,
        async_save: bool = True,
        cpu_group=None,
    ):
        """`procs`: this rank among the processes (loop/placement/processes.py; `rank` and `is_main` are all a save
        reads of it). `cpu_group`: the gloo group for the host-side agreement (bytes to write, the space
        verdict, barriers) -- `ParallelState.cpu_group`; when not given, `procs.cpu_group` or, at save
        time, `policy.state.cpu_group`. Never the default group: on GPU that is NCCL, which refuses
        host tensors ("No backend type associated with device type cpu")."""
        self.root, self.procs = root, procs
        self.cpu_group = cpu_group if cpu_group is not None else getattr(procs, "cpu_group", None)
        self.keep_last, self.keep_every, self.async_save = keep_last, keep_every, async_save
        self._queue = None
        self._pending: tuple[Path, int] | None = None  # (directory, bytes) of the save in flight
        self.last_save: dict[str, float] = {}
        if async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self._queue = AsyncCallsQueue()

    def save(self, step: int, policy, reference, run_state: dict, critic=None) -> Path:
        """Start (async) or do (sync) the save of `step`; returns the directory it will have when complete.
        `critic`: PPO's, saved with its optimizer beside the policy."""
        from megatron.core import dist_checkpointing

        self.wait()  # at most one save in flight
        t0 = time.perf_counter()
        final, work, rank = step_dir(self.root, step), partial_dir(self.root, step), self.procs.rank
        if self.cpu_group is None:
            self.cpu_group = getattr(getattr(policy, "state", None), "cpu_group", None)
        group = self.cpu_group
        state = sharded_state(policy, reference, critic=critic)
        needed = self._check_space(bytes_to_write(state))
        if self.procs.is_main:
            shutil.rmtree(work, ignore_errors=True)  # an earlier attempt's leftovers, never loaded
            with self._disk_errors(work, needed):
                (work / "dist").mkdir(parents=True)  # dist-checkpointing wants it to exist, empty
                # no fsync (blocking time): a file a crash loses fails verification against the manifest
                (work / "run_state.json").write_text(json.dumps(run_state, indent=1))
        dist.barrier(group=group)
        rank_file = work / f"rank_{rank:05d}.pt"

        def mine() -> list[Path]:
            return [rank_file, *sorted((work / "dist").glob(f"__{rank}_*"))]

        with self._disk_errors(work, needed):
            torch.save(rng_state(), rank_file)
            request = dist_checkpointing.save(
                state, str(work / "dist"), async_sharded_save=self.async_save, content_metadata=FORMAT
            )
        models = [policy] + ([critic] if critic is not None else [])
        nbytes = sum(p.numel() * p.element_size() for m in models for p in m.model.parameters())
        if self.async_save:
            request = request._replace(async_fn=_then_write_sums(request.async_fn, work, rank, mine))
            request.add_finalize_fn(lambda: self._complete(work, final, step, t0))
            self._pending = (work, needed)
            self._queue.schedule_async_request(request)
        else:
            write_sums(work, rank, mine())
            dist.barrier(group=group)
            self._complete(work, final, step, t0)
        self.last_save = {"step": step, "blocking_s": time.perf_counter() - t0, "local_param_bytes": nbytes}
        return final

    def _check_space(self, local_bytes: int) -> int:
        """Bytes the whole save writes (all ranks); raises NoSpaceError on every rank if they do not fit.

        Host tensors on the gloo `cpu_group`. Every rank reaches the same verdict: a rank that raised
        alone would leave the others blocked in the next barrier until the process-group timeout."""
        group = self.cpu_group
        t = torch.tensor([local_bytes, 0], dtype=torch.int64, device="cpu")
        try:
            ensure_space(self.root, local_bytes)
        except NoSpaceError:
            t[1] = 1
        dist.all_reduce(t, group=group)
        needed = int(t[0])
        # rank 0 compares the total with the checkpoint disk's free space; its verdict is shared
        verdict = torch.tensor(
            [int(bool(t[1])) or int(self.procs.is_main and _free(self.root) < needed)], device="cpu"
        )
        dist.all_reduce(verdict, op=dist.ReduceOp.MAX, group=group)
        if verdict.item():
            raise NoSpaceError(self.root, needed)
        return needed

    @contextmanager
    def _disk_errors(self, directory: Path, needed: int):
        """Turn a full disk, however the writer words it, into a NoSpaceError that says what to do."""
        try:
            yield
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - torch's CheckpointException is a BaseException
            # Only the rank whose write failed sees the ENOSPC; the others get a bare "write failed",
            # explained just as well by a disk that no longer has room for the save.
            if is_disk_full(e) or (needed > 0 and _free(directory) < needed):
                raise NoSpaceError(directory, needed) from e
            raise

    def _complete(self, work: Path, final: Path, step: int, t0: float) -> None:
        """Runs on every rank once all ranks' shards are written; rank 0 seals the checkpoint and prunes."""
        self._pending = None
        if self.procs.is_main:
            with self._disk_errors(work, 0):
                manifest = write_manifest(work, step)
                write_text(work / MARKER, json.dumps({"step": step, "seconds": time.perf_counter() - t0}))
            replace_into_place(work, final)
            removed = prune(self.root, self.keep_last, self.keep_every, verified=final)
            log.info(
                "checkpoint %s complete in %.2f s (%d files, %d bytes)%s",
                final,
                time.perf_counter() - t0,
                len(manifest["files"]),
                manifest["total_bytes"],
                f" (pruned {len(removed)})" if removed else "",
            )

    def poll(self) -> None:
        """Finalise an async save if every rank has finished writing (cheap; call once per step)."""
        if self._queue is not None:
            with self._disk_errors(*(self._pending or (self.root, 0))):
                self._queue.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        if self._queue is not None:
            with self._disk_errors(*(self._pending or (self.root, 0))):
                self._queue.maybe_finalize_async_calls(blocking=True)

    def close(self) -> None:
        self.wait()
        if self._queue is not None:
            self._queue.close()


def _free(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free
