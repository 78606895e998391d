"""The parallel layout of a run: where every rank sits, for the trainer and the rollout engines.

One type, built once from the recipe (`ParallelLayout.from_config`) and handed to everything that
reasons about ranks: `validate` and the planner (before any process exists), the trainer's process
groups, the engines and the publisher. A rank's coordinates (its TP/CP/DP/PP index, its engine and
its rank inside that engine) are methods here and nowhere else.

Pure Python, no torch.distributed. The trainer rank order matches megatron-core's default
`order="tp-cp-ep-dp-pp"` (TP fastest, PP slowest), so the maps here agree with
`parallel_state.initialize_model_parallel`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from megatron_rl.config.problem import Problem
from megatron_rl.parallel import rules
from megatron_rl.parallel.rules import PLACEMENTS, RECOMPUTE_MODES, SYNCHRONIES  # noqa: F401 (re-exported)

# megatron-core's rank order (`initialize_model_parallel(order=...)`), fastest-varying first.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


@dataclass(frozen=True)
class TrainerCoord:
    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class ExpertCoord:
    """A rank's place in the expert layers' own grid (megatron-core's expert rank generator: ETP
    fastest, then EP, then expert-DP, PP slowest): which expert shard it holds."""

    etp: int
    ep: int
    edp: int
    pp: int


@dataclass(frozen=True)
class EngineCoord:
    engine: int  # which engine replica
    tp: int  # rank inside that engine's TP group

    @property
    def is_leader(self) -> bool:
        """The engine's first TP rank: the one that submits prompts and receives the outputs."""
        return self.tp == 0


@dataclass(frozen=True)
class ParallelLayout:
    """Trainer TP/PP/DP/CP/EP, sequence parallelism, recompute and PP split; engine TP and count;
    colocated or separated; synchronous or one step asynchronous."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    # Expert tensor parallelism: the expert layers' own TP (megatron-core's
    # `expert_tensor_parallel_size`); EP x ETP ranks share one replica of the experts.
    etp: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective | full
    pp_layers: tuple[int, ...] = ()  # explicit layers per PP stage; () = even split
    engine_tp: int = 1
    engine_count: int = 1
    engine_ep: bool = False  # MoE engines: whole experts per engine rank (vLLM expert parallelism)
    placement: str = "colocated"  # colocated | separated
    synchrony: str = "sync"  # sync | async
    # The order megatron-core numbers trainer ranks in; recipes keep the default (tests that emulate
    # a separated trainer inside one job put PP before DP, so one replica sits on the first ranks).
    order: str = DEFAULT_ORDER

    def __post_init__(self):
        if sorted(self.order.split("-")) != ["cp", "dp", "ep", "pp", "tp"]:
            raise ValueError(f"layout order {self.order!r} must be a permutation of tp-cp-ep-dp-pp")

    @classmethod
    def over(cls, world: int, tp: int = 1, pp: int = 1, **kw) -> ParallelLayout:
        """A colocated layout filling `world` ranks: DP from the rest, one TP-1 engine per rank unless
        given (tools and tests that size the trainer from the launcher's world)."""
        if world % (tp * pp):
            raise ValueError(f"world size {world} is not divisible by tp x pp = {tp} x {pp}")
        kw.setdefault("engine_count", world // kw.get("engine_tp", 1))
        return cls(tp=tp, pp=pp, dp=world // (tp * pp), **kw)

    @classmethod
    def from_config(cls, layout) -> ParallelLayout:
        """From the recipe's `layout` group (config.schema.LayoutConfig, whose keys are this type's fields
        but `order`); the one place it is read (run/resolve.py calls it)."""
        values = {f: getattr(layout, f) for f in RECIPE_FIELDS}
        return cls(**{**values, "pp_layers": tuple(values["pp_layers"])})

    def as_overrides(self) -> list[str]:
        """The Hydra overrides that set this layout in a recipe (the inverse of `from_config`), e.g.
        to run the layout the planner's search ranks first."""
        out = []
        for key in RECIPE_FIELDS:
            value = getattr(self, key)
            if key == "pp_layers":
                out.append(f"layout.pp_layers=[{','.join(str(n) for n in value)}]")
            else:
                out.append(f"layout.{key}={str(value).lower() if isinstance(value, bool) else value}")
        return out

    def with_(self, **kw) -> ParallelLayout:
        return replace(self, **kw)

    def model_dp(self, tp: int = 0, pp: int = 0) -> int:
        """A second model's DP on these trainer ranks at tp x pp (0 = this layout's): the ranks over TP x PP,
        over CP, or 0 when TP x PP does not divide them (`for_model`, validate and the planner's search read
        it)."""
        tp, pp = tp or self.tp, pp or self.pp
        world = self.trainer_world
        return 0 if world % (tp * pp) else world // (tp * pp) // self.cp

    def for_model(self, tp: int = 0, pp: int = 0) -> ParallelLayout:
        """A second model's layout on the same trainer ranks (PPO's critic: critic.tp, critic.pp; 0 = this
        layout's): DP = the ranks over TP x PP, the trainer's layer split at the trainer's PP (an even one at
        another), sequence parallelism kept only where TP > 1. Itself when both are this layout's. Raises when TP x PP does not divide the ranks."""
        tp, pp = tp or self.tp, pp or self.pp
        if (tp, pp) == (self.tp, self.pp):
            return self
        dp = self.model_dp(tp, pp)
        if not dp:
            raise ValueError(
                f"tp x pp = {tp} x {pp} does not divide the trainer's {self.trainer_world} ranks"
            )
        return replace(
            self,
            tp=tp,
            pp=pp,
            dp=dp,
            pp_layers=self.pp_layers if pp == self.pp else (),  # the trainer's split while the stages are its
            sequence_parallel=self.sequence_parallel and tp > 1,
        )

    # ---- sizes ----
    @property
    def colocated(self) -> bool:
        return self.placement == "colocated"

    @property
    def overlapped(self) -> bool:
        """Generation of step t+1 runs while step t trains: needs disjoint pools."""
        return not self.colocated and self.synchrony == "async"

    @property
    def trainer_gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def engine_gpus(self) -> int:
        return self.engine_tp * self.engine_count

    @property
    def gpus(self) -> int:
        """Processes (GPUs) in the job: shared ranks when colocated, disjoint pools when separated."""
        return self.trainer_gpus if self.colocated else self.trainer_gpus + self.engine_gpus

    # The names the rank maps use; the same numbers as the GPU counts above.
    trainer_world = trainer_gpus
    engine_world = engine_gpus
    world_size = gpus

    def sizes(self) -> dict[str, int]:
        """The trainer's sizes as a plain record (checkpoints keep it to refuse a changed layout)."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp}

    def stage_layers(self, num_layers: int) -> list[int]:
        """Layers per pipeline stage: the explicit split, else an even one (when PP does not divide the
        layers, megatron-core's: an even middle, the rest on the first and last stages; `validate`
        refuses that case for a run without an explicit split)."""
        if self.pp_layers:
            return list(self.pp_layers)
        return rules.megatron_split(num_layers, self.pp)

    def stage_range(self, num_layers: int, stage: int) -> range:
        """Global layer indices held by one PP stage."""
        split = self.stage_layers(num_layers)
        start = sum(split[:stage])
        return range(start, start + split[stage])

    # ---- trainer ranks (megatron's order, default tp-cp-ep-dp-pp: TP fastest, PP slowest) ----
    def _dims(self) -> list[tuple[str, int]]:
        sizes = {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        return [(d, sizes[d]) for d in self.order.split("-")]  # EP is folded into DP for dense layers

    def trainer_coord(self, rank: int) -> TrainerCoord:
        if not 0 <= rank < self.trainer_world:
            raise ValueError(f"rank {rank} is not a trainer rank (trainer world {self.trainer_world})")
        idx, rest = {}, rank
        for dim, size in self._dims():
            idx[dim], rest = rest % size, rest // size
        return TrainerCoord(tp=idx["tp"], cp=idx["cp"], dp=idx["dp"], pp=idx["pp"])

    def trainer_rank(self, c: TrainerCoord) -> int:
        idx = {"tp": c.tp, "cp": c.cp, "ep": 0, "dp": c.dp, "pp": c.pp}
        rank = 0
        for dim, size in reversed(self._dims()):
            rank = rank * size + idx[dim]
        return rank

    @property
    def expert_dp(self) -> int:
        """Replicas of the experts: the ranks of a PP stage over the ranks one replica spans (ETP x EP)."""
        return self.tp * self.cp * self.dp // (self.etp * self.ep)

    def expert_coord(self, rank: int) -> ExpertCoord:
        """Where a trainer rank sits among the expert layers' shards (the same order as `trainer_coord`,
        with ETP for TP, EP in its own place, CP folded into expert-DP), as megatron-core numbers them."""
        if not 0 <= rank < self.trainer_world:
            raise ValueError(f"rank {rank} is not a trainer rank (trainer world {self.trainer_world})")
        sizes = {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.expert_dp, "pp": self.pp}
        idx, rest = {}, rank
        for dim in self.order.split("-"):
            idx[dim], rest = rest % sizes[dim], rest // sizes[dim]
        return ExpertCoord(etp=idx["tp"], ep=idx["ep"], edp=idx["dp"], pp=idx["pp"])

    def tp_group(self, rank: int) -> list[int]:
        c = self.trainer_coord(rank)
        return [self.trainer_rank(TrainerCoord(t, c.cp, c.dp, c.pp)) for t in range(self.tp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.trainer_coord(rank)
        return [self.trainer_rank(TrainerCoord(c.tp, c.cp, c.dp, p)) for p in range(self.pp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.trainer_coord(rank)
        return [self.trainer_rank(TrainerCoord(c.tp, c.cp, d, c.pp)) for d in range(self.dp)]

    def is_trainer(self, rank: int) -> bool:
        return rank < self.trainer_world

    # ---- engine ranks ----
    @property
    def _engine_base(self) -> int:
        return 0 if self.colocated else self.trainer_world

    def engine_ranks(self, engine: int) -> list[int]:
        """Global ranks of one engine's TP group: the first ranks when colocated, after the trainer when not."""
        if not 0 <= engine < self.engine_count:
            raise ValueError(f"engine {engine} out of range (engine_count {self.engine_count})")
        base = self._engine_base
        return [base + engine * self.engine_tp + t for t in range(self.engine_tp)]

    def engine_coord(self, rank: int) -> EngineCoord | None:
        """This rank's engine and its rank inside it; None for a rank that holds no engine."""
        local = rank - self._engine_base
        if not 0 <= local < self.engine_world:
            return None
        return EngineCoord(engine=local // self.engine_tp, tp=local % self.engine_tp)

    # ---- the one check of a layout ----
    def check(self, model, cluster) -> list[Problem]:
        """Every reason this layout cannot run `model` on `cluster` (empty: it can).

        `model` is the recipe's model group (or a ModelSpec), `cluster` its cluster group (or the
        planner's Hardware). `validate`, `submit`, the planner, its layout search, the reshard plan and
        the driver all apply these rules (megatron_rl/parallel/rules.py). Problems of kind "driver" are
        layouts the planner models but the training driver cannot run yet.
        """
        out = rules.size_problems(self)
        if out:
            return out  # the rules below divide by these
        out += rules.trainer_problems(self, model)
        out += rules.engine_problems(self.engine_tp, model, self.engine_ep)
        out += rules.placement_problems(self)
        return out + rules.cluster_problems(self, cluster)

    # ---- words ----
    def describe(self) -> str:
        tr = f"trainer TP{self.tp} PP{self.pp} DP{self.dp}" + (f" CP{self.cp}" if self.cp > 1 else "")
        if self.ep > 1 or self.etp > 1:
            tr += f" EP{self.ep} ETP{self.etp}"
        en = f"{self.engine_count} x TP{self.engine_tp} engine{'' if self.engine_count == 1 else 's'}"
        if self.colocated:
            return f"colocated {self.gpus} GPUs: {tr}, {en}, recompute {self.recompute}"
        mode = "async" if self.overlapped else "sync"
        return (
            f"separated {self.engine_gpus}+{self.trainer_gpus} GPUs ({mode}): {tr}, {en}, "
            f"recompute {self.recompute}"
        )


# The recipe's `layout` keys: every field of the type but the rank order (not a recipe setting).
RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelLayout) if f.name != "order")
