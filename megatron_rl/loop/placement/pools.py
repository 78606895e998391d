"""Separated placement in one job: a trainer pool and an engine pool, each its own torch world.

The launcher (torchrun, srun) starts `layout.gpus` processes, trainer ranks first:

    job ranks   0 .. T-1          the trainer pool (megatron-core's groups live here)
    job ranks   T .. T+E-1        the engine pool  (vLLM's groups live here)

megatron-core and vLLM both build their groups from the *default* world: megatron-core derives its
data-parallel size from `get_world_size()`, and vLLM's `external_launcher` builds its world group from
every rank of the default world (every rank must join, so an engine built on a subset of a shared world
hangs). Neither takes a sub-world. So each pool gets a default world of its own, made from the job's
rendezvous store under a per-pool prefix, and the two pools talk over a third group, the *job group*:
every rank, ranked by its job rank. Publication (reshard/publish.py) and the batches the engines send
(loop/step/collect.py) run on it.

The job group is made with torch's process-group helper and registered with job ranks as its "global"
ranks, so `dist.*` calls take it like any group (`src`/`dst`/`peer` are job ranks). One caveat, kept
away from: `dist.get_rank(job_group)` maps this process's *pool* rank, so ask the group itself
(`group.rank()`, `Pools.job_rank`).

The job group uses the pools' backend (NCCL on GPU: weights cross on the device) and a gloo twin
carries host objects (sample batches, control flags); on CPU both are gloo, and still two groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from megatron_rl.parallel.dist_env import DistEnv, from_env
from megatron_rl.parallel.layout import ParallelLayout

TRAINER, ENGINE = "trainer", "engine"


@dataclass(frozen=True)
class Pools:
    """This process's place in a separated job (see the module docstring)."""

    role: str  # "trainer" | "engine"
    job: DistEnv  # the launcher's ranks: job rank, job world
    pool_rank: int
    pool_size: int
    job_group: object  # device group over every rank (NCCL on GPU)
    job_cpu_group: object  # gloo group over every rank, for host objects

    @property
    def is_trainer(self) -> bool:
        return self.role == TRAINER

    @property
    def job_rank(self) -> int:
        return self.job.rank

    @property
    def pool_env(self) -> DistEnv:
        """The pool's world as a DistEnv: what the pool's libraries must see as RANK / WORLD_SIZE."""
        j = self.job
        return DistEnv(
            self.pool_rank,
            self.pool_size,
            j.local_rank,
            j.local_world_size,
            j.master_addr,
            j.master_port,
            j.launcher,
        )


def role_of(layout: ParallelLayout, job_rank: int) -> tuple[str, int, int]:
    """(role, pool rank, pool size) of a job rank in a separated layout (trainer ranks first)."""
    t = layout.trainer_world
    if job_rank < t:
        return TRAINER, job_rank, t
    if job_rank < layout.gpus:
        return ENGINE, job_rank - t, layout.engine_world
    raise ValueError(f"job rank {job_rank} is outside the {layout.gpus} ranks of {layout.describe()}")


def start_pools(layout: ParallelLayout, backend: str, timeout_s: float, env: DistEnv | None = None) -> Pools:
    """Join the job's rendezvous, make this pool's default world and the job groups. Collective: every
    rank of the job calls it once, before anything else touches torch.distributed."""
    from torch.distributed import distributed_c10d as c10d

    from megatron_rl.trainer import device_guard

    device_guard.install_from_env()  # before any group exists (tests), as init_parallel does
    env = env or from_env()
    if env.world_size != layout.gpus:
        raise ValueError(
            f"{env.world_size} processes were launched for {layout.describe()}, which needs "
            f"{layout.trainer_world} trainer + {layout.engine_world} engine = {layout.gpus} processes"
        )
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already up: separated pools must make the default world")
    env.export()  # env:// reads these
    if backend == "nccl":
        import torch

        torch.cuda.set_device(env.local_rank)  # before any NCCL group: one GPU per process
    timeout = timedelta(seconds=timeout_s)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    if (rank, world) != (env.rank, env.world_size):
        raise RuntimeError(f"rendezvous gave rank {rank}/{world}, the launcher {env.rank}/{env.world_size}")
    role, pool_rank, pool_size = role_of(layout, rank)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"pool-{role}", store),
        rank=pool_rank,
        world_size=pool_size,
        timeout=timeout,
    )

    def job_group(name: str, kind: str):
        group, _ = c10d._new_process_group_helper(
            world, rank, list(range(world)), kind, store, name, timeout=timeout
        )
        # Job ranks are the group's "global" ranks: dist.* maps src/dst/peer through this table.
        c10d._world.pg_group_ranks[group] = {r: r for r in range(world)}
        return group

    # Two groups even on CPU, where both are gloo: the code that picks one is then the GPU's, and the
    # device guard (tests) checks each collective against the kind of group it runs on.
    device_group = job_group("job", backend)
    cpu_group = job_group("job-cpu", "gloo")
    device_guard.declare_cpu_group(cpu_group)
    return Pools(role, env, pool_rank, pool_size, device_group, cpu_group)


def pool_env_for_engine(pools: Pools) -> dict[str, str]:
    """The environment vLLM's external launcher reads (RANK, WORLD_SIZE): the engine pool's, not the
    job's. Set on engine ranks once their pool exists (loop/placement/processes.py), before the engine is built."""
    return {"RANK": str(pools.pool_rank), "WORLD_SIZE": str(pools.pool_size)}
