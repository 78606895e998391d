"""A model at its own layout: megatron-core process groups for a TP x PP x DP other than the trainer's.

megatron-core's `parallel_state` holds one set of model-parallel groups per process, the trainer's. A second
model on the same ranks (PPO's critic) may want another split: a critic as large as the policy fits at the
policy's layout, but a small critic beside a large policy wastes ranks on TP it does not need, and a critic
wider than the policy needs more. megatron-core 0.16 builds a model, its DDP, its distributed optimizer and its
pipeline schedule from an explicit `ProcessGroupCollection` instead of the globals; this module makes that
collection from a `ParallelLayout` over the same world, with the coordinates the layout computes (the one
place ranks get their coordinates), and the `ParallelState` the model's `Policy` reads.

Every rank creates every group, in the same order (torch.distributed's rule for `new_group`). Dense models
only, without context parallelism: the expert and context groups are the trainer's business.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import torch.distributed as dist

from megatron_rl.parallel.layout import ParallelLayout, TrainerCoord
from megatron_rl.trainer.parallel import ParallelState


def _groups_of(layout: ParallelLayout, members) -> list[list[int]]:
    """Every rank's group under `members(rank) -> ranks`, each once, in the order of their first rank."""
    seen: dict[tuple[int, ...], None] = {}
    for rank in range(layout.trainer_world):
        seen.setdefault(tuple(members(rank)), None)
    return [list(g) for g in seen]


def _make(layout: ParallelLayout, members, rank: int, timeout: timedelta, backend=None):
    """Create the groups `members` partitions the world into (collective); return this rank's."""
    mine = None
    for ranks in _groups_of(layout, members):
        group = dist.new_group(ranks=ranks, timeout=timeout, backend=backend)
        if rank in ranks:
            mine = group
    return mine


def model_groups(layout: ParallelLayout, rank: int, timeout_s: float):
    """A `ProcessGroupCollection` for a dense model at `layout` (cp = 1), on the default world's backend.

    Collective over every rank. The embedding group joins the first and the last stage of a pipeline line
    (the ranks that hold a tied embedding's two copies); with one stage it is the rank alone."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    if layout.cp != 1 or layout.ep != 1 or layout.etp != 1:
        raise ValueError(
            f"a model at its own layout is dense without context parallelism; {layout.describe()} has "
            f"cp={layout.cp}, ep={layout.ep}, etp={layout.etp}"
        )
    timeout = timedelta(seconds=timeout_s)

    def embedding(r: int) -> list[int]:
        line = layout.pp_group(r)
        return sorted({line[0], line[-1]})

    def model_parallel(r: int) -> list[int]:
        c = layout.trainer_coord(r)
        return sorted(
            layout.trainer_rank(TrainerCoord(t, 0, c.dp, p))
            for p in range(layout.pp)
            for t in range(layout.tp)
        )

    g = ProcessGroupCollection()
    g.tp = _make(layout, layout.tp_group, rank, timeout)
    g.pp = _make(layout, layout.pp_group, rank, timeout)
    g.dp = _make(layout, layout.dp_group, rank, timeout)
    g.mp = _make(layout, model_parallel, rank, timeout)
    g.embd = _make(layout, embedding, rank, timeout)
    alone = _make(layout, lambda r: [r], rank, timeout)  # each rank by itself (created collectively)
    g.cp = g.pos_embd = alone  # no context parallelism; RoPE models have no learned position embedding
    g.tp_cp, g.dp_cp, g.intra_dp_cp = g.tp, g.dp, g.dp
    # One distributed-optimizer instance over every rank: the gradient norm sums each rank's slice of each
    # TP x PP shard, so its reduction spans them all (the DP group alone misses the other shards)
    g.intra_dist_opt = _make(layout, lambda r: list(range(layout.trainer_world)), rank, timeout)
    # No experts, but DDP and the optimizer ask for their groups (and DDP would make a missing expert-DP
    # group with a per-rank `new_group`, which every rank must enter alike): each rank alone.
    g.ep = g.expt_tp = g.expt_dp = g.intra_expt_dp = alone
    g.tp_ep, g.tp_ep_pp = g.tp, g.mp
    return g


def state_at(state: ParallelState, layout: ParallelLayout, timeout_s: float) -> ParallelState:
    """The `ParallelState` of a model at `layout` on `state`'s ranks: its coordinates from `layout`, its
    groups built here (collective over every rank). `layout` keeps the trainer's placement and order."""
    if layout.trainer_world != state.layout.trainer_world:
        raise ValueError(
            f"a model at {layout.describe()} needs {layout.trainer_world} ranks; the trainer has "
            f"{state.layout.trainer_world}"
        )
    groups = model_groups(layout, state.env.rank, timeout_s)
    return replace(state, layout=layout, groups=groups)


def copy_weights(src, dst, skip: tuple[str, ...] = ()) -> list[str]:
    """Copy `src`'s weights into `dst`, a model of the same body at another layout (PPO's critic started from
    the policy): each full tensor travels once from the rank that gathered it to every rank, and each rank of
    `dst` takes its own TP shard. Vocabulary rows are cut to the vocabulary and padded to `dst`'s padding
    (it grows with TP). Names in `skip` (a value head) are left alone. Returns the names this rank copied.

    Collective over every rank; one full tensor at a time in device memory, never a stage."""
    import torch

    from megatron_rl.models.hf import shard_kind, tp_shard
    from megatron_rl.trainer.gather import full_tensors

    mine = dict(dst.named_parameters_global())
    done: set[str] = set()
    wrong: list[str] = []
    for name, full in full_tensors(src, everywhere=True):
        target = mine.get(name)
        if target is None or name in skip:
            continue
        if shard_kind(name) == "vocab":
            rows = torch.zeros((dst.padded_vocab, *full.shape[1:]), dtype=full.dtype, device=full.device)
            n = dst.spec.vocab_size
            rows[:n] = full[:n]
            full = rows
        shard = tp_shard(dst.spec, name, full, dst.state.tp, dst.state.tp_rank)
        if tuple(shard.shape) != tuple(target.shape):  # raised after the loop: the other ranks are in it
            wrong.append(
                f"{name}: the source's shard is {tuple(shard.shape)}, the model's {tuple(target.shape)}"
            )
            continue
        with torch.no_grad():
            target.copy_(shard)
        done.add(name)
    if wrong:
        raise RuntimeError(f"TP rank {dst.state.tp_rank} of {dst.state.tp}: {'; '.join(wrong[:3])}")
    left = sorted(set(mine) - done - set(skip))
    if left:  # a name the source does not have: the bodies differ (fail here, not with a half-copied model)
        raise RuntimeError(f"{len(left)} of the model's tensors have no source tensor: {left[:3]}")
    return sorted(done)
