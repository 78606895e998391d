"""A model's full tensors from its shards: what the HF export writes and what a model at another layout
takes its own shards of (trainer/model_groups.py copy_weights).

Every rank of the model group takes part. The model travels one tensor at a time: the owning stage's TP
ranks (an expert's: its EP rank's expert TP ranks) all-gather that tensor's shards, the group's leader (TP
rank 0, DP rank 0) unshards it and sends it on (to rank 0, or to every rank). Device memory beyond the model
is one full tensor (x TP for the gather), never a whole stage: an `all_gather_object` of stages over NCCL
stages every payload on the GPU, the largest stage x the world size on every rank (~122 GB per GPU for a 7B
model on 8 ranks). Only the names, shapes and owners -- a few kilobytes -- are exchanged as objects, on the
CPU group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron_rl.models.hf import expert_of, shard_kind, tp_unshard

# One entry per tensor: (global name, full shape, dtype name), in the stage leader's order.
TensorMeta = tuple[str, tuple[int, ...], str]


def full_shape(name: str, local_shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """The unsharded shape of a megatron tensor from one TP shard's shape (see models/hf.py); `tp` is
    the degree the tensor is split over (the expert TP for an expert's weights: `hf.tp_of`)."""
    kind = shard_kind(name)
    shape = list(local_shape)
    if kind in ("vocab", "qkv", "fc1"):
        shape[0] *= tp
    elif kind == "row":
        shape[1] *= tp
    return tuple(shape)


def _holding(policy, name: str):
    """(the group that splits this tensor, its size, whether this rank's copy is the one exported).

    Dense tensors: the TP group, DP replica 0 (the model's own groups when it has a layout of its own:
    trainer/model_groups.py). An MoE model's expert weights: the expert TP group of the EP rank that holds
    the expert, expert-DP replica 0."""
    from megatron.core import parallel_state as ps

    st = policy.state
    if expert_of(name) is not None:
        return (
            ps.get_expert_tensor_parallel_group(),
            ps.get_expert_tensor_parallel_world_size(),
            ps.get_expert_data_parallel_rank() == 0,
        )
    if st.groups is not None:
        return st.groups.tp, st.tp, st.dp_rank == 0
    return (
        ps.get_tensor_model_parallel_group(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_data_parallel_rank() == 0,
    )


def _owners(policy) -> list[tuple[int, list[TensorMeta]]]:
    """(global rank of a leader, the tensors it exports) for every leader, stage by stage. A leader is
    a group's first rank in an exported replica: the TP group's for dense tensors, each EP rank's expert
    TP group's for its experts. Collective (an object gather of names and shapes only, on the CPU group)."""
    from megatron.core import parallel_state as ps

    lead_dense = policy.state.tp_rank == 0
    lead_expert = ps.get_expert_tensor_parallel_rank() == 0 if policy.spec.is_moe else lead_dense
    mine: list[TensorMeta] = []
    for name, p in policy.named_parameters_global():
        _, size, exported = _holding(policy, name)
        leads = lead_expert if expert_of(name) is not None else lead_dense
        if exported and leads:
            mine.append((name, full_shape(name, tuple(p.shape), size), str(p.dtype).removeprefix("torch.")))
    entry = (policy.state.pp_rank, mine) if mine else None
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, entry, group=policy.state.cpu_group)
    stages = sorted((e[0], rank, e[1]) for rank, e in enumerate(parts) if e is not None)
    return [(rank, metas) for _, rank, metas in stages]


def full_tensors(policy, everywhere: bool = False):
    """Yield (global name, full megatron tensor) for the whole model, one tensor at a time (module docstring).

    On rank 0 only, in host memory (elsewhere the tensor is None), or with `everywhere` on every rank, on the
    model's device (a broadcast from the leader: what a model at another layout takes its shard of).
    Collective over every rank: each must draw the generator to its end."""
    rank = dist.get_rank()
    params = dict(policy.named_parameters_global())
    device = policy.state.device
    for leader, metas in _owners(policy):
        for name, shape, dtype in metas:
            full = None
            if name in params:
                group, size, exported = _holding(policy, name)
                if exported:
                    p = params[name].detach().contiguous()
                    shards = [torch.empty_like(p) for _ in range(size)]
                    dist.all_gather(shards, p, group=group)
                    full = tp_unshard(policy.spec, name, shards) if rank == leader else None
            if everywhere:
                if rank != leader:
                    full = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                full = full.contiguous()
                dist.broadcast(full, src=leader)
                yield name, full
            elif leader == 0:
                yield name, full.cpu() if rank == 0 else None
            elif rank == leader:
                dist.send(full.contiguous(), dst=0)
                yield name, None
            elif rank == 0:
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                dist.recv(buf, src=leader)
                yield name, buf.cpu()
            else:
                yield name, None


def full_state(policy) -> dict[str, torch.Tensor]:
    """Full megatron tensors of the whole model on rank 0, in host memory (empty dict elsewhere).

    Collective over every rank; streamed tensor by tensor (module docstring)."""
    return {name: t for name, t in full_tensors(policy) if t is not None}
