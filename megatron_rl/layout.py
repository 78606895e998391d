"""Where every rank sits: trainer TP x CP x DP x PP and the rollout engines.

Pure Python, no torch.distributed: the reshard planner, the capacity planner, `validate` and the
Slurm renderer all reason about ranks before any process exists. The trainer rank order matches
megatron-core's default `order="tp-cp-ep-dp-pp"` (TP fastest, PP slowest), so the maps here agree
with `parallel_state.initialize_model_parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerCoord:
    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class EngineCoord:
    engine: int  # which engine replica
    tp: int  # rank inside that engine's TP group


@dataclass(frozen=True)
class ParallelLayout:
    """Trainer TP/PP/DP/CP sizes and engine TP/count; colocated or separated."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    engine_tp: int = 1
    engine_count: int = 1
    colocated: bool = True

    @property
    def trainer_world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def engine_world(self) -> int:
        return self.engine_tp * self.engine_count

    @property
    def world_size(self) -> int:
        """Processes in the job: shared ranks when colocated, disjoint pools when separated."""
        if self.colocated:
            return self.trainer_world
        return self.trainer_world + self.engine_world

    # ---- trainer ranks (megatron order tp-cp-dp-pp) ----
    def trainer_coord(self, rank: int) -> TrainerCoord:
        if not 0 <= rank < self.trainer_world:
            raise ValueError(f"rank {rank} is not a trainer rank (trainer world {self.trainer_world})")
        tp = rank % self.tp
        rest = rank // self.tp
        cp = rest % self.cp
        rest //= self.cp
        dp = rest % self.dp
        pp = rest // self.dp
        return TrainerCoord(tp=tp, cp=cp, dp=dp, pp=pp)

    def trainer_rank(self, c: TrainerCoord) -> int:
        return c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))

    def tp_group(self, rank: int) -> list[int]:
        c = self.trainer_coord(rank)
        return [self.trainer_rank(TrainerCoord(t, c.cp, c.dp, c.pp)) for t in range(self.tp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.trainer_coord(rank)
        return [self.trainer_rank(TrainerCoord(c.tp, c.cp, c.dp, p)) for p in range(self.pp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.trainer_coord(rank)
        return [self.trainer_rank(TrainerCoord(c.tp, c.cp, d, c.pp)) for d in range(self.dp)]

    # ---- engine ranks ----
    def engine_ranks(self, engine: int) -> list[int]:
        """Global ranks of one engine's TP group: the first ranks when colocated, after the trainer when not."""
        if not 0 <= engine < self.engine_count:
            raise ValueError(f"engine {engine} out of range (engine_count {self.engine_count})")
        base = 0 if self.colocated else self.trainer_world
        return [base + engine * self.engine_tp + t for t in range(self.engine_tp)]

    def engine_coord(self, rank: int) -> EngineCoord | None:
        base = 0 if self.colocated else self.trainer_world
        local = rank - base
        if not 0 <= local < self.engine_world:
            return None
        return EngineCoord(engine=local // self.engine_tp, tp=local % self.engine_tp)

    def is_trainer(self, rank: int) -> bool:
        return rank < self.trainer_world

    @classmethod
    def from_config(cls, layout) -> ParallelLayout:  # layout: config.schema.LayoutConfig
        return cls(
            tp=layout.tp,
            pp=layout.pp,
            dp=layout.dp,
            cp=layout.cp,
            engine_tp=layout.engine_tp,
            engine_count=layout.engine_count,
            colocated=layout.placement == "colocated",
        )


def pp_layer_split(num_layers: int, pp: int, explicit: list[int] | None = None) -> list[int]:
    """Layers per pipeline stage: the explicit split when given, else an even one."""
    if explicit:
        return list(explicit)
    return [num_layers // pp] * pp


def pp_stage_layers(num_layers: int, pp: int, stage: int, explicit: list[int] | None = None) -> range:
    """Global layer indices held by one PP stage."""
    split = pp_layer_split(num_layers, pp, explicit)
    start = sum(split[:stage])
    return range(start, start + split[stage])
