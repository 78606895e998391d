"""The plan of a recipe as typed data: one frozen dataclass per section of the report.

The text renderer and the Gantt plot read these fields; `PlanReport.to_json()` is the one place the
`--json` dict is made. Field names are the JSON keys (so a dotted key of REQUIRED_KEYS is also an
attribute path), and field order is the JSON order, which `--json` readers may rely on. Three field
markers cover where the JSON shape is not a plain field: `renamed` (a key Python cannot spell),
`inlined` (a mapping whose keys sit beside the section's own), `omitted_when_none` (a section that is
absent rather than null). Values keep the exact Python types the planner computed (an int stays an
int), so the JSON is byte-identical to the dict the report used to be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from megatron_rl.plan.cost import Cost
from megatron_rl.plan.cycle import Cycle
from megatron_rl.plan.generation import Generation
from megatron_rl.plan.inputs import GIB

_NAME, _INLINE, _OMIT = "json_name", "json_inline", "json_omit_none"
T = TypeVar("T")


def renamed(key: str) -> Any:
    """A field whose JSON key is not a Python name (`async`)."""
    return field(metadata={_NAME: key})


def inlined() -> Any:
    """A mapping whose items are written beside the section's own keys, not under its own key."""
    return field(metadata={_INLINE: True})


def omitted_when_none() -> Any:
    """An optional section: its key is left out of the JSON when absent (not written as null)."""
    return field(default=None, metadata={_OMIT: True})


def to_json(x: Any) -> Any:
    """Dataclasses to dicts in field order, tuples to lists, mappings copied; values as they are."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out: dict = {}
        for f in dataclasses.fields(x):
            value = getattr(x, f.name)
            if f.metadata.get(_OMIT) and value is None:
                continue
            if f.metadata.get(_INLINE):
                out.update(to_json(value))
            else:
                out[f.metadata.get(_NAME, f.name)] = to_json(value)
        return out
    if isinstance(x, Mapping):
        return {k: to_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_json(v) for v in x]
    return x


def from_dict(cls: type[T], d: Mapping[str, Any], **typed: Any) -> T:
    """A section from a planner module's dict (keys as in the JSON); `typed` gives its nested sections.

    Strict on purpose: a key the section has no field for is a TypeError, so a number a module adds
    cannot slip out of the report unnoticed. Lists become tuples (the sections are frozen).
    """
    names = {f.metadata.get(_NAME, f.name): f.name for f in dataclasses.fields(cls)}
    kwargs = {names.get(k, k): tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return cls(**(kwargs | typed))


@dataclass(frozen=True)
class Units:
    """How the report counts: bytes that move in decimal GB, memory held in GiB (both appear)."""

    bytes_moved: str = "decimal GB = 1e9 B; rates GB/s"
    memory_held: str = "GiB = 2^30 B"
    links: str = "InfiniBand Gb/s divided by 8 -> GB/s"
    flops: str = "FLOP (PFLOP = 1e15 in the text)"
    time: str = "seconds"


@dataclass(frozen=True)
class Assumptions:
    """The efficiencies and constants the prediction rests on, stated so a reader can dispute them."""

    train_mfu: float
    generation_bw_fraction: float
    prefix_sharing: bool
    trainer_runtime_gib: float
    engine_runtime_gib: float
    decode_allreduce_latency_s: float
    max_num_seqs: int
    host_link_gbps: float
    restart_s: float
    restart_source: str  # assumed, the run's measured init (--from-steps) or benchmarks/recovery.py's parts
    completion_lengths: str = "mean for the bulk; the longest completion reaches the cap"


@dataclass(frozen=True)
class ModelSummary:
    name: str
    params: int
    matmul_params: int
    dtype: str
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    # A mixture of experts only (absent from a dense model's JSON): the params one token uses, and
    # the experts per layer and per token.
    active_params: int | None = omitted_when_none()
    experts: int | None = omitted_when_none()
    experts_per_token: int | None = omitted_when_none()
    expert_gemm: str | None = omitted_when_none()  # grouped | per_expert (models/experts.py)
    # The models beside the policy (absent when there are none): PPO's critic and a learned reward model;
    # `assumed` the recipe keys whose shape could not be read here and was taken to be the policy's.
    critic: SideModel | None = omitted_when_none()
    reward_model: SideModel | None = omitted_when_none()
    assumed: tuple[str, ...] | None = omitted_when_none()


@dataclass(frozen=True)
class SideModel:
    """A model beside the policy on the trainer's GPUs (plan/models.py): its shape and head."""

    key: str  # the recipe key it comes from: critic.init or reward.model_checkpoint
    source: str  # "policy" (the critic starts from the policy's weights) or the checkpoint's path
    params: int
    matmul_params: int
    layers: int
    hidden: int
    head: str  # value | score: one output per token, no vocabulary-sized output layer
    shape_assumed: bool  # its config.json could not be read here: the policy's shape was taken


@dataclass(frozen=True)
class ClusterSummary:
    """The hardware in the units the text prints (GiB held, GB/s moved, TFLOPS, days)."""

    nodes: int
    gpus_per_node: int
    gpus: int
    gpu_memory_gib: float
    hbm_gbps: float
    peak_tflops: float
    nvlink_gbps: float
    node_ib_gbps: float
    storage_gbps: float
    node_mtbf_days: float


@dataclass(frozen=True)
class CycleRow:
    """One layout's step, flattened for tables: the recipe's own, a split of its GPUs, a search hit."""

    describe: str = renamed("layout")
    placement: str
    synchrony: str
    tp: int
    pp: int
    dp: int
    engine_tp: int
    engine_count: int
    recompute: str
    engine_gpus: int
    trainer_gpus: int
    gpus: int
    phases_s: Mapping[str, float]
    serial_s: float
    collection_s: float
    learning_s: float
    overlapped_s: float
    step_s: float
    gpu_seconds: float
    peak_gib: float
    fits: bool
    reasons: tuple[str, ...]

    @classmethod
    def of(cls, c: Cycle) -> CycleRow:
        lay = c.layout
        return cls(
            describe=lay.describe(),
            placement=lay.placement,
            synchrony=lay.synchrony,
            tp=lay.tp,
            pp=lay.pp,
            dp=lay.dp,
            engine_tp=lay.engine_tp,
            engine_count=lay.engine_count,
            recompute=lay.recompute,
            engine_gpus=lay.engine_gpus,
            trainer_gpus=lay.trainer_gpus,
            gpus=lay.gpus,
            phases_s=dict(c.phases),
            serial_s=c.serial_s,
            collection_s=c.collection_s,
            learning_s=c.learning_s,
            overlapped_s=c.overlapped_s,
            step_s=c.step_s,
            gpu_seconds=c.gpu_seconds,
            peak_gib=c.memory["peak"] / GIB,
            fits=c.fits,
            reasons=tuple(c.reasons),
        )


@dataclass(frozen=True)
class PerSampleTokens:
    prompt: int
    completion: int  # mean
    completion_cap: int


@dataclass(frozen=True)
class Tokens:
    """Tokens of one step; the prompt counted once per sample, and once per group as `prompt_unique`."""

    sequences: int
    prompt: int
    prompt_unique: int
    completion: int
    trained: int
    per_sample: PerSampleTokens


@dataclass(frozen=True)
class Flops:
    """FLOPs per step; `train` and the recompute count algorithm.epochs passes. PPO's critic and a reward
    model are counted apart (0 without them); `by_model` gives every model's FLOPs by what it runs."""

    train: float
    train_recompute_extra: float
    logprob_forwards: float
    old_logprobs: float
    ref_logprobs: float
    prefill_shared: float
    prefill_unshared: float
    epochs: int = 1
    critic_values: float = 0.0
    critic_train: float = 0.0
    critic_recompute_extra: float = 0.0
    reward_model: float = 0.0
    by_model: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuSeconds:
    """GPU-seconds of work at the assumed efficiencies; `*_held` counts GPUs held, busy or not."""

    train: float
    train_recompute_extra: float
    logprob_forwards: float
    generation: float
    generation_held: float
    prefill: float
    step_held: float
    step_work: float
    critic: float = 0.0  # PPO's critic: old values, training and its recompute
    reward_model: float = 0.0  # a learned reward model's forward


@dataclass(frozen=True)
class Scoring:
    """The CPU pool: `serial_s` unstreamed; streamed, `hidden_s` of it overlaps generation and, when the
    batch comes before its rewards, `behind_forwards_s` of that overlaps the forwards that need none."""

    core_seconds: float
    waves: int
    serial_s: float
    exposed_s: float
    hidden_s: float
    turns: int = 1  # multi-turn: environment runs per trajectory (plan/scoring.py)
    behind_forwards_s: float = 0.0
    # A reward fleet (reward.fleet_nodes; 0: none): its size, and the nodes that would keep up with generation
    fleet_nodes: int = 0
    fleet_cpus_per_node: int = 0
    fleet_nodes_to_keep_up: int = 0


@dataclass(frozen=True)
class Seconds:
    """Wall seconds of the step that runs (calibrated when measured); `phases` are written inline."""

    longest_completion_floor: float
    scoring: float
    scoring_exposed: float
    scoring_hidden: float
    serial_cycle: float
    overlapped_cycle: float | None  # None: no overlapped option fits these GPUs
    collection_path: float | None
    learning_path: float | None
    step: float
    phases: Mapping[str, float] = inlined()  # every phase but scoring (above, split)


@dataclass(frozen=True)
class PublicationCut:
    cut: str
    bytes: float
    gbps: float
    floor_s: float


@dataclass(frozen=True)
class PublicationSchemes:
    """One node's IB as the bottleneck: one copy, k replicas through it, a broadcast tree."""

    link_gbps: float
    replicas: int
    one_copy_s: float
    k_replicas_one_bottleneck_s: float
    broadcast_tree_s: float


@dataclass(frozen=True)
class Publication:
    bytes: float
    cuts: tuple[PublicationCut, ...]
    floor_s: float
    schemes: PublicationSchemes
    pack_s: float
    install_s: float
    validate_s: float
    total_s: float


@dataclass(frozen=True)
class TrainerMemory:
    """GiB per trainer GPU on the heaviest PP stage; `total` is the training-phase peak: the parts above
    it, and with PPO the critic's training state (`critic`) and what its activations and values
    (`critic_activations`) exceed the policy's activations and logits (one model trains at a time)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    reference: float
    runtime: float
    total: float
    reference_logprobs_total: float
    stage: int
    in_flight_microbatches: int
    stages: int
    recompute: str
    resident_while_generating: float
    resident_at_engine_construction: float
    critic: float = 0.0
    critic_activations: float = 0.0
    reward_model_forward_total: float = 0.0  # the reward model's forward moment (0 without one)


@dataclass(frozen=True)
class ModelMemory:
    """One model's share of a trainer GPU on the heaviest stage, in GiB; `parameters` is how many of its
    parameters that GPU holds (a count), so a trained model's `state` = params + grads + optimizer =
    parameters x bytes_per_param (18 with bf16 unsharded: 2 + 4 fp32 main grads + 12, the 12 divided by
    optimizer_shards = DP x CP with the distributed optimizer). A frozen model holds only its params."""

    parameters: float
    params: float
    grads: float | None = omitted_when_none()
    optimizer: float | None = omitted_when_none()
    state: float | None = omitted_when_none()
    bytes_per_param: float | None = omitted_when_none()
    optimizer_shards: int | None = omitted_when_none()
    activations: float | None = omitted_when_none()
    logits: float | None = omitted_when_none()  # the policy's, on the last stage
    values: float | None = omitted_when_none()  # the critic's, on the last stage
    recompute: str | None = omitted_when_none()
    micro_batch_size: int | None = omitted_when_none()
    on_device: str | None = omitted_when_none()


@dataclass(frozen=True)
class EngineMemory:
    weights: float
    runtime: float
    kv_cache: float
    total: float
    kv_tokens_per_engine: int
    resident_while_training: float
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class MemoryReport:
    """Memory per GPU in GiB; activations by recompute mode show what each mode would buy."""

    trainer_per_gpu: float
    engine_per_gpu: float
    peak_per_gpu: float
    gpu_memory: float
    trainer: TrainerMemory
    engine: EngineMemory
    activations_by_recompute: Mapping[str, float]
    fits: bool
    reasons: tuple[str, ...]
    # Each model's share of a trainer GPU (policy, critic, reference, reward model: those present), and the
    # total of every moment the GPU goes through (generating, training, constructing, the forwards of an
    # offloaded reference and of a reward model), engine included.
    by_model: Mapping[str, ModelMemory] = field(default_factory=dict)
    moments: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    bytes: float
    bytes_per_param: int
    write_s: float
    read_s: float
    blocking_s: float
    async_save: bool = renamed("async")


@dataclass(frozen=True)
class Reliability:
    """Failures and checkpoints over the whole run; `interval_source` is recipe, young_daly or never."""

    checkpoint: Checkpoint
    nodes: int
    job_mtbf_s: float
    expected_failures: float
    young_daly_interval_s: float
    young_daly_interval_if_sync_s: float
    interval_steps: int
    interval_steps_optimal: int
    interval_source: str
    saves: int
    save_overhead_s: float
    restart_s: float
    lost_per_failure_s: float
    expected_lost_s: float
    startup_s: float
    total_s: float


@dataclass(frozen=True)
class Target:
    steps: int
    hours: float
    predicted_hours: float
    margin_hours: float
    steps_in_target: int
    predicted_hours_with_young_daly: float | None  # only when the recipe never saves


@dataclass(frozen=True)
class Dominant:
    """The phase that leads in GPU-seconds of work and the one that leads in wall time, and why."""

    gpu_seconds: str
    wall: str
    work_gpu_s: Mapping[str, float]
    wall_s: Mapping[str, float]
    why: str


@dataclass(frozen=True)
class CalibrationSummary:
    """Measured (median) vs predicted phase seconds; a phase is rescaled by a factor or an offset."""

    steps: int
    measured_s: Mapping[str, float]
    predicted_s: Mapping[str, float]
    factors: Mapping[str, float]
    offsets: Mapping[str, float]
    init_s: float | None
    mem_gib_max: Mapping[str, float]


@dataclass(frozen=True)
class Rejection:
    layout: str
    reason: str
    kind: str  # memory, topology or divisibility


@dataclass(frozen=True)
class SearchSummary:
    gpus: int
    evaluated: int
    ranked: tuple[CycleRow, ...]
    accepted: int
    rejected_by_kind: Mapping[str, int]
    rejected_examples: tuple[Rejection, ...]


@dataclass(frozen=True)
class AllToAllPhase:
    """One phase's expert-parallel all-to-all per trainer rank (plan/alltoall.py)."""

    count: int
    nvlink_bytes: float
    ib_bytes: float
    ib_bytes_per_node: float
    seconds: float


@dataclass(frozen=True)
class AllToAll(AllToAllPhase):
    """A mixture of experts' token all-to-all per step and trainer rank, by network cut (the totals, as
    one phase's fields), and per phase; the seconds are inside the phases (train_fwd_bwd, old/ref
    log-probs)."""

    ep: int
    etp: int
    phases: Mapping[str, AllToAllPhase]


@dataclass(frozen=True)
class PlanReport:
    """Everything the planner knows about a recipe on its layout (built by report.build_report)."""

    recipe: str
    units: Units
    assumptions: Assumptions
    model: ModelSummary
    cluster: ClusterSummary
    layout: CycleRow
    weights_bytes: int
    kv_bytes_per_token: int
    tokens: Tokens
    flops: Flops
    gpu_seconds: GpuSeconds
    generation: Generation
    scoring: Scoring
    seconds: Seconds
    phases_s: Mapping[str, float]  # the step that runs, calibrated when measured
    overlap: CycleRow | None  # the overlapped steady state, if any split of these GPUs fits
    splits: tuple[CycleRow, ...]  # colocated vs separated on all GPUs
    publication: Publication
    memory_gib: MemoryReport
    reliability: Reliability
    target: Target
    cost: Cost
    meets_target: bool
    dominant: Dominant
    calibrated: bool
    calibration: CalibrationSummary | None = omitted_when_none()
    search: SearchSummary | None = omitted_when_none()
    alltoall: AllToAll | None = omitted_when_none()  # a mixture of experts only

    def to_json(self) -> dict:
        """The `--json` dict: every section in field order (non-finite numbers left to the caller)."""
        out = to_json(self)
        # The own layout also carries its description as "describe", a key --json readers use.
        out["layout"]["describe"] = self.layout.describe
        return out
