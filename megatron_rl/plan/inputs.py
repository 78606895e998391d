"""The numbers the planner reasons with, read once from a recipe and checked.

Every estimate in this package is a pure function of a `PlanInputs` (model, workload, hardware,
assumptions) and a `ParallelLayout` (how the GPUs are split; the run's own type). Keeping the layout separate is what lets
the search ask the same questions of hundreds of layouts without touching the recipe.

Units inside the package are SI base units: bytes, seconds, FLOPs, bytes/s. Link rates the cluster
config gives in Gb/s (InfiniBand) are divided by 8 here, once; rates given in GB/s or TB/s are
decimal (1 GB = 1e9 B). Memory that is *held* is reported in GiB (2^30 B) by the report only.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_rl.layout import RECOMPUTE_MODES, ParallelLayout
from megatron_rl.models.spec import ModelSpec
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for

GB = 1e9
GIB = 2**30

# GPU <-> host copies (colocated offload, async checkpoint staging): PCIe Gen5 x16 delivers ~64 GB/s
# on paper; 25 GB/s is a sustained pinned-memory rate. Not in the cluster config, so assumed here.
HOST_LINK_BYTES_PER_S = 25e9


class PlanError(ValueError):
    """A recipe value the planner cannot work with; the message names the key and the fix."""


@dataclass(frozen=True)
class Workload:
    """One GRPO step: what is generated, scored and trained."""

    prompts: int
    samples_per_prompt: int
    prompt_tokens: int  # expected (mean) prompt length
    max_prompt_tokens: int
    completion_tokens: int  # expected (mean) completion length
    max_new_tokens: int  # the cap; the longest completion of a big batch reaches it
    minibatches: int
    micro_batch_size: int
    reference_forward: bool  # KL to a frozen reference needs its log-probs every step
    seconds_per_sample: float  # scoring, in one core of the pool
    pool_cores: int
    steps: int  # target steps (plan.target_steps)

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def sequence_tokens(self) -> int:
        """Mean tokens of one trained sequence (prompt + completion)."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def max_sequence_tokens(self) -> int:
        """The longest sequence any phase must hold in memory."""
        return self.max_prompt_tokens + self.max_new_tokens


@dataclass(frozen=True)
class Hardware:
    """The cluster, with every rate converted to bytes/s or FLOP/s."""

    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float
    nvlink_bytes_per_s: float  # per GPU, inside a node
    node_ib_bytes_per_s: float  # per node: NICs x Gb/s / 8
    storage_bytes_per_s: float  # shared storage, total
    node_mtbf_s: float
    is_cpu: bool
    host_link_bytes_per_s: float = HOST_LINK_BYTES_PER_S

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_ib_bytes_per_s(self) -> float:
        """One GPU's share of its node's NICs (the rate a cross-node collective gets per GPU)."""
        return self.node_ib_bytes_per_s / self.gpus_per_node


@dataclass(frozen=True)
class Assumptions:
    """What the planner cannot know and the recipe states (plan group and engine settings)."""

    train_mfu: float
    generation_bw_fraction: float
    prefix_sharing: bool
    gpu_memory_utilization: float
    kv_cache_bytes: int  # 0 = the engine sizes its KV cache from gpu_memory_utilization
    sleep_level: int
    distributed_optimizer: bool
    publish_pack_s: float
    publish_install_s: float
    publish_validate_s: float
    target_hours: float
    checkpoint_interval_steps: int  # N > 0 steps; -1 = the Young/Daly interval; 0 = never
    async_save: bool
    # The frozen reference's weights (when the KL needs one): on the GPU throughout, or on the host
    # between uses (algorithm.reference).
    reference: str = "resident"  # resident | offload


@dataclass(frozen=True)
class PlanInputs:
    name: str
    spec: ModelSpec
    work: Workload
    hw: Hardware
    assume: Assumptions

    # ---- model numbers every module uses ----
    @property
    def params(self) -> int:
        """All parameters, unpadded vocabulary: what a published or exported copy holds."""
        return self.spec.num_params()

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every layer and the output projection.

        The input embedding is a table lookup and costs no FLOPs; with tied embeddings the same
        matrix is still the output projection, so it is counted once either way.
        """
        s = self.spec
        return s.num_layers * s.layer_params() + s.vocab_size * s.hidden_size

    @property
    def weights_bytes(self) -> int:
        return self.params * self.spec.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.spec.kv_bytes_per_token()


def _positive(value, key: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise PlanError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}; set it in the recipe")


def inputs_from_recipe(recipe) -> PlanInputs:
    """Read and check the planner's numbers from a `RecipeConfig`; bad values fail with the key."""
    spec = ModelSpec.from_config(recipe.model)
    d, r, c, p = recipe.data, recipe.rollout, recipe.cluster, recipe.plan
    for key, value in [
        ("data.prompts_per_step", d.prompts_per_step),
        ("data.prompt_tokens", d.prompt_tokens),
        ("rollout.samples_per_prompt", r.samples_per_prompt),
        ("rollout.mean_completion_tokens", r.mean_completion_tokens),
        ("rollout.max_new_tokens", r.max_new_tokens),
        ("algorithm.minibatches", recipe.algorithm.minibatches),
        ("optim.micro_batch_size", recipe.optim.micro_batch_size),
        ("reward.pool_cores", recipe.reward.pool_cores),
        ("cluster.nodes", c.nodes),
        ("cluster.gpus_per_node", c.gpus_per_node),
        ("cluster.gpu_memory_gib", c.gpu_memory_gib),
        ("cluster.hbm_bandwidth_tbps", c.hbm_bandwidth_tbps),
        ("cluster.peak_tflops_bf16", c.peak_tflops_bf16),
        ("cluster.nvlink_gbps", c.nvlink_gbps),
        ("cluster.ib_gbps_per_nic", c.ib_gbps_per_nic),
        ("cluster.nics_per_node", c.nics_per_node),
        ("cluster.storage_gbps", c.storage_gbps),
        ("cluster.node_mtbf_days", c.node_mtbf_days),
        ("plan.target_steps", p.target_steps),
        ("plan.target_hours", p.target_hours),
    ]:
        _positive(value, key)
    _positive(recipe.reward.seconds_per_sample, "reward.seconds_per_sample", allow_zero=True)
    for key, value in [
        ("plan.train_mfu", p.train_mfu),
        ("plan.generation_bw_fraction", p.generation_bw_fraction),
        ("rollout.gpu_memory_utilization", r.gpu_memory_utilization),
    ]:
        if not 0.0 < value <= 1.0:
            raise PlanError(f"{key}={value} must be a fraction in (0, 1]")
    if r.mean_completion_tokens > r.max_new_tokens:
        raise PlanError(
            f"rollout.mean_completion_tokens={r.mean_completion_tokens} exceeds rollout.max_new_tokens="
            f"{r.max_new_tokens}: the mean cannot be above the cap; lower the mean or raise the cap"
        )
    if d.prompt_tokens > d.max_prompt_tokens:
        raise PlanError(
            f"data.prompt_tokens={d.prompt_tokens} exceeds data.max_prompt_tokens={d.max_prompt_tokens}"
        )
    longest = d.max_prompt_tokens + r.max_new_tokens
    if longest > recipe.model.max_position_embeddings:
        raise PlanError(
            f"data.max_prompt_tokens + rollout.max_new_tokens = {longest} exceeds "
            f"model.max_position_embeddings={recipe.model.max_position_embeddings}; lower the caps"
        )
    if recipe.checkpoint.interval < -1:
        raise PlanError(
            f"checkpoint.interval={recipe.checkpoint.interval}: use N > 0 steps, -1 for the Young/Daly "
            "interval, or 0 for never"
        )
    for key in ("publish_pack_s", "publish_install_s", "publish_validate_s"):
        _positive(getattr(p, key), f"plan.{key}", allow_zero=True)
    work = Workload(
        prompts=d.prompts_per_step,
        samples_per_prompt=r.samples_per_prompt,
        prompt_tokens=d.prompt_tokens,
        max_prompt_tokens=d.max_prompt_tokens,
        completion_tokens=r.mean_completion_tokens,
        max_new_tokens=r.max_new_tokens,
        minibatches=recipe.algorithm.minibatches,
        micro_batch_size=recipe.optim.micro_batch_size,
        reference_forward=recipe.algorithm.kl_coef > 0,
        seconds_per_sample=recipe.reward.seconds_per_sample,
        pool_cores=recipe.reward.pool_cores,
        steps=p.target_steps,
    )
    hw = Hardware(
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        gpu_memory_bytes=c.gpu_memory_gib * GIB,
        hbm_bytes_per_s=c.hbm_bandwidth_tbps * 1e12,
        peak_flops=c.peak_tflops_bf16 * 1e12,
        nvlink_bytes_per_s=c.nvlink_gbps * GB,
        node_ib_bytes_per_s=c.nics_per_node * c.ib_gbps_per_nic * GB / 8,
        storage_bytes_per_s=c.storage_gbps * GB,
        node_mtbf_s=c.node_mtbf_days * 86400.0,
        is_cpu=c.gpu == "cpu",
    )
    assume = Assumptions(
        train_mfu=p.train_mfu,
        generation_bw_fraction=p.generation_bw_fraction,
        prefix_sharing=p.prefix_sharing,
        gpu_memory_utilization=r.gpu_memory_utilization,
        kv_cache_bytes=r.kv_cache_bytes,
        sleep_level=sleep_level_for(r.sleep_level, delivery_for(on_gpu=c.gpu != "cpu")),
        distributed_optimizer=recipe.optim.distributed_optimizer,
        publish_pack_s=p.publish_pack_s,
        publish_install_s=p.publish_install_s,
        publish_validate_s=p.publish_validate_s,
        target_hours=p.target_hours,
        checkpoint_interval_steps=recipe.checkpoint.interval,
        async_save=recipe.checkpoint.async_save,
        reference=recipe.algorithm.reference,
    )
    return PlanInputs(name=recipe.name, spec=spec, work=work, hw=hw, assume=assume)


def layout_from_recipe(recipe) -> ParallelLayout:
    """The recipe's own layout; a separated one takes its engine GPUs from `layout.engine_gpus`."""
    lay = recipe.layout
    if lay.placement not in ("colocated", "separated"):
        raise PlanError(f"layout.placement={lay.placement!r} must be 'colocated' or 'separated'")
    if lay.synchrony not in ("sync", "one_step_async"):
        raise PlanError(f"layout.synchrony={lay.synchrony!r} must be 'sync' or 'one_step_async'")
    if lay.recompute not in RECOMPUTE_MODES:
        raise PlanError(f"layout.recompute={lay.recompute!r} must be one of {RECOMPUTE_MODES}")
    for key in ("tp", "pp", "dp", "cp", "engine_tp", "engine_count"):
        _positive(getattr(lay, key), f"layout.{key}")
    out = ParallelLayout.from_config(lay)
    if out.pp_layers and (len(out.pp_layers) != out.pp or sum(out.pp_layers) != recipe.model.num_layers):
        raise PlanError(
            f"layout.pp_layers={list(out.pp_layers)} must have layout.pp={out.pp} entries summing to "
            f"model.num_layers={recipe.model.num_layers}"
        )
    if out.colocated and out.trainer_gpus != out.engine_gpus:
        raise PlanError(
            f"colocated layout: trainer tp*pp*dp*cp={out.trainer_gpus} must equal engine_tp*engine_count="
            f"{out.engine_gpus} (every GPU holds a trainer shard and an engine shard)"
        )
    if not out.colocated and lay.engine_gpus and lay.engine_gpus != out.engine_gpus:
        raise PlanError(
            f"separated layout: layout.engine_gpus={lay.engine_gpus} but engine_tp*engine_count="
            f"{out.engine_gpus}; make them agree"
        )
    gpus = recipe.cluster.nodes * recipe.cluster.gpus_per_node
    if out.gpus > gpus:
        raise PlanError(
            f"the layout needs {out.gpus} GPUs but the cluster has {gpus} "
            f"(cluster.nodes x cluster.gpus_per_node); shrink dp/engine_count or add nodes"
        )
    return out
