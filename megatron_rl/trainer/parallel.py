"""Process groups: torch.distributed from the launcher's environment, then megatron-core's groups.

gloo on CPU, NCCL on GPU. The CPU patches are applied here (explicitly, only without CUDA) because
this is the first point at which megatron-core code runs in a trainer process.

Two kinds of group, declared once here so the same code is right on both machines:
- device groups (the default group and megatron-core's): NCCL on GPU, their tensors live on the
  policy's device;
- `ParallelState.cpu_group`, an explicit gloo group over every rank, for host-side agreement
  (preemption flags, telemetry reductions): its tensors live on the host, on CPU and GPU alike.

The process-group timeout is the recipe's `cluster.dist_timeout_s`: fast ranks wait inside a
collective for the slowest (an engine still finishing a 16k-token completion), so it must exceed
the longest phase, not a fixed 600 s.

With MEGATRON_RL_DEVICE_GUARD=1 (tests), `trainer/device_guard.py` is installed first: tensors made
without a device land on `meta`, and collectives check their tensors against the group's kind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from megatron_rl.parallel.dist_env import DistEnv, from_env
from megatron_rl.parallel.layout import ExpertCoord, ParallelLayout, TrainerCoord


@dataclass(frozen=True)
class ParallelState:
    """This rank in the run: the layout, its coordinates in it (computed by the layout, nowhere else),
    its device and the host group."""

    env: DistEnv
    layout: ParallelLayout
    device: torch.device
    cpu_group: object = None  # explicit gloo group over every rank, for host tensors
    # A model at a layout other than megatron-core's global one (trainer/model_groups.py): its own
    # ProcessGroupCollection; None = the global groups, the trainer's.
    groups: object = None

    @property
    def coord(self) -> TrainerCoord:
        return self.layout.trainer_coord(self.env.rank)

    @property
    def expert_coord(self) -> ExpertCoord:
        """This rank among the expert layers' shards (EP, ETP, expert-DP)."""
        return self.layout.expert_coord(self.env.rank)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def tp_rank(self) -> int:
        return self.coord.tp

    @property
    def pp_rank(self) -> int:
        return self.coord.pp

    @property
    def dp_rank(self) -> int:
        return self.coord.dp

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


DEFAULT_TIMEOUT_S = 1800.0


def launched_world() -> int:
    """Processes the launcher started (torchrun/srun environment; 1 without one)."""
    return from_env().world_size


def init_parallel(
    layout: ParallelLayout,
    seed: int = 1234,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    pool_env: DistEnv | None = None,
) -> ParallelState:
    """Initialise torch.distributed (if not yet) and megatron-core's model-parallel groups at `layout`.

    `pool_env`: a separated job's trainer pool (loop/placement/pools.py), whose default world is already up and
    holds the trainer ranks alone; megatron-core's groups are then built inside it."""
    from megatron_rl.trainer import device_guard
    from megatron_rl.trainer.cpu_compat import apply_cpu_patches, cuda_available

    if timeout_s <= 0:
        raise ValueError(f"process-group timeout must be > 0 s (cluster.dist_timeout_s); got {timeout_s}")
    device_guard.install_from_env()  # before any group exists, so every group's kind is recorded
    env = pool_env or from_env()
    if pool_env is None:
        env.export()
    if env.world_size != layout.trainer_world:
        raise ValueError(
            f"{env.world_size} processes were launched for a trainer of tp x pp x dp x cp = "
            f"{layout.trainer_world} ranks ({layout.describe()}); launch {layout.trainer_world} processes "
            "or change the layout"
        )
    on_gpu = cuda_available()
    if not on_gpu:
        apply_cpu_patches()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    else:
        torch.cuda.set_device(env.local_rank)
    if not dist.is_initialized():
        if not layout.colocated:
            raise RuntimeError(
                "a separated layout's trainer pool is made by loop/placement/pools.py (start_pools) before init_parallel"
            )
        dist.init_process_group(
            backend="nccl" if on_gpu else "gloo",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.etp,
            distributed_timeout_minutes=max(1, round(timeout_s / 60)),
            order=layout.order,
        )
    model_parallel_cuda_manual_seed(seed)
    # Collective: every rank creates it, in the same order relative to the other groups.
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    state = ParallelState(
        env=env,
        layout=layout,
        device=torch.device("cuda", env.local_rank) if on_gpu else torch.device("cpu"),
        cpu_group=cpu_group,
    )
    # megatron-core numbered the groups itself: they must be the layout's, or shards land on wrong ranks.
    theirs = (
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        ps.get_data_parallel_rank(),
        ps.get_data_parallel_world_size(),
    )
    if theirs != (state.tp_rank, state.pp_rank, state.dp_rank, layout.dp):
        raise RuntimeError(
            f"rank {env.rank}: megatron-core's groups give (tp, pp, dp rank, dp size) = {theirs}, the layout "
            f"{(state.tp_rank, state.pp_rank, state.dp_rank, layout.dp)}; they were built at another layout "
            "(destroy_model_parallel first)"
        )
    ec = state.expert_coord
    theirs_ep = (ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank())
    if theirs_ep != (ec.ep, ec.etp):
        raise RuntimeError(
            f"rank {env.rank}: megatron-core's expert groups give (ep, etp rank) = {theirs_ep}, the layout "
            f"{(ec.ep, ec.etp)}: the expert shards would be read for the wrong experts"
        )
    return state


def destroy_parallel() -> None:
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
