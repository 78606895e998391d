"""This rank among the job's processes: the recipe's layout, megatron-core's groups, rank 0.

Apart from the run's records (records.py) because most callees need only one of the two: the builders
place an engine by rank, the checkpointer agrees with the other ranks over the gloo group, and neither
has any business with the console or the sinks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from megatron_rl.loop.placement.pools import Pools, pool_env_for_engine, start_pools
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.trainer.parallel import ParallelState, init_parallel


@dataclass(frozen=True)
class Processes:
    """The process groups of one rank. Everything but the DP group is read from `state`, which holds the
    layout and the gloo group already: one place for each.

    Separated placement (loop/placement/pools.py): `pools` says which pool this rank is in. A trainer rank has a
    `state` over the trainer pool; an engine rank has none (no megatron-core there) and its `cpu_group`
    spans the engine pool. `job_group` / `job_cpu_group` span every rank: the default group when
    colocated, the job groups when separated."""

    state: ParallelState | None
    # megatron-core's data-parallel group (NCCL on GPU): device-tensor reductions over the DP replicas.
    dp_group: object
    pools: Pools | None = None
    engine_cpu_group: object = None  # separated engine ranks: gloo over the engine pool
    engine_layout: ParallelLayout | None = None  # separated engine ranks (trainer ranks: state.layout)
    dp_cpu_group: object = None  # the DP group's gloo twin (megatron-core's): host objects over the replicas

    @classmethod
    def start(cls, run) -> Processes:
        """Initialise torch.distributed and megatron-core's groups at the run's layout (run/resolve.py).
        Collective: every rank calls it at the same point, so the groups are created in the same order
        everywhere."""
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        layout, recipe = run.layout, run.recipe
        timeout_s = recipe.cluster.dist_timeout_s
        pools = None
        if not layout.colocated:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            pools = start_pools(layout, backend, timeout_s)
            if not pools.is_trainer:
                os.environ.update(pool_env_for_engine(pools))  # what vLLM's launcher reads
                group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                return cls(None, None, pools, group, layout)
        state = init_parallel(
            layout, seed=recipe.seed, timeout_s=timeout_s, pool_env=pools.pool_env if pools else None
        )
        from megatron.core import parallel_state as ps

        return cls(state, ps.get_data_parallel_group(), pools, dp_cpu_group=ps.get_data_parallel_group_gloo())

    @property
    def layout(self) -> ParallelLayout:
        return self.state.layout if self.state is not None else self.engine_layout

    @property
    def rank(self) -> int:
        """The job rank (trainer ranks first when separated)."""
        return self.pools.job_rank if self.pools is not None else self.state.env.rank

    @property
    def is_trainer(self) -> bool:
        return self.state is not None

    @property
    def is_main(self) -> bool:
        """Job rank 0 (a trainer rank): the one that writes the run's files and talks to the terminal."""
        return self.rank == 0

    @property
    def cpu_group(self):
        """The explicit gloo group over every rank of this rank's pool (the job when colocated), for host
        tensors (NCCL refuses them)."""
        return self.state.cpu_group if self.state is not None else self.engine_cpu_group

    @property
    def job_group(self):
        """Every rank of the job, device tensors: None (the default group) when colocated."""
        return self.pools.job_group if self.pools is not None else None

    @property
    def job_cpu_group(self):
        """Every rank of the job, host objects (gloo)."""
        return self.pools.job_cpu_group if self.pools is not None else self.cpu_group
