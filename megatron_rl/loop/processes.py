"""This rank among the job's processes: the recipe's layout, megatron-core's groups, rank 0.

Apart from the run's records (records.py) because most callees need only one of the two: the builders
place an engine by rank, the checkpointer agrees with the other ranks over the gloo group, and neither
has any business with the console or the sinks.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_rl.layout import ParallelLayout
from megatron_rl.trainer.parallel import ParallelState, init_parallel


@dataclass(frozen=True)
class Processes:
    """The process groups of one rank. Everything but the DP group is read from `state`, which holds the
    layout and the gloo group already: one place for each."""

    state: ParallelState
    # megatron-core's data-parallel group (NCCL on GPU): device-tensor reductions over the DP replicas.
    dp_group: object

    @classmethod
    def start(cls, recipe) -> Processes:
        """Initialise torch.distributed and megatron-core's groups at the recipe's layout. Collective: every
        rank calls it at the same point, so the groups are created in the same order everywhere."""
        layout = ParallelLayout.from_config(recipe.layout)
        state = init_parallel(layout, seed=recipe.seed, timeout_s=recipe.cluster.dist_timeout_s)
        from megatron.core import parallel_state as ps

        return cls(state, ps.get_data_parallel_group())

    @property
    def layout(self) -> ParallelLayout:
        return self.state.layout

    @property
    def rank(self) -> int:
        return self.state.env.rank

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the run's files and talks to the terminal."""
        return self.rank == 0

    @property
    def cpu_group(self):
        """The explicit gloo group over every rank, for host tensors (NCCL refuses them)."""
        return self.state.cpu_group
