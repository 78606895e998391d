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

from megatron_rl.algorithms.old_policy import needs_forward
from megatron_rl.models.experts import GROUPED, expert_gemm
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.schedule import defers_scoring

GB = 1e9
GIB = 2**30

# GPU <-> host copies (colocated offload, async checkpoint staging): PCIe Gen5 x16 delivers ~64 GB/s
# on paper; 25 GB/s is a sustained pinned-memory rate. Not in the cluster config, so assumed here.
HOST_LINK_BYTES_PER_S = 25e9
# Per-expert GEMMs (megatron-core's SequentialMLP: what runs without transformer-engine's grouped GEMM,
# models/experts.py) run each local expert as its own small MLP from Python: about six kernels (the
# split, fc1, SwiGLU, the routing weights, fc2, the concatenation) and a module call per expert, MoE
# layer and microbatch. Charged at 40 us per forward and twice that backward, on top of the FLOPs at the
# assumed MFU (a grouped GEMM issues every expert's GEMM in one call: inside the MFU). Not measured here.
PER_EXPERT_FORWARD_S = 40e-6


class PlanError(ValueError):
    """A recipe value the planner cannot work with; the message names the key and the fix."""


@dataclass(frozen=True)
class Workload:
    """One step (GRPO or PPO): what is generated, scored and trained."""

    prompts: int
    samples_per_prompt: int
    prompt_tokens: int  # expected (mean) prompt length
    max_prompt_tokens: int
    completion_tokens: int  # expected (mean) completion length
    max_new_tokens: int  # the cap; the longest completion of a big batch reaches it
    minibatches: int
    micro_batch_size: int
    reference_forward: bool  # KL to a frozen reference needs its log-probs every step
    # A trainer forward for the old log-probs (algorithm.old_logprobs; algorithms/old_policy.py): none
    # when the update's own forward or the engines' log-probs stand in for it.
    old_forward: bool
    seconds_per_sample: float  # scoring, in one core of the pool
    pool_cores: int  # the pool's cores: reward.pool_cores, or the fleet's nodes x CPUs per node
    steps: int  # the run's steps (the recipe's `steps`)
    # Multi-turn (rollout.env): turns per trajectory, each graded by its environment in the pool (the
    # planner takes rollout.max_turns: a trajectory that passes early takes fewer). 1: single-turn.
    turns: int = 1
    # Passes over the minibatches (algorithm.epochs): each minibatch of each pass is one optimizer step of
    # the policy (and of the critic with PPO).
    epochs: int = 1
    # The critic's passes (critic.epochs, the policy's when 0); PPO only.
    critic_epochs: int = 1
    # Synchronous, the batch returns when generation ends and the forwards that need no reward run while the
    # pool scores (parallel/schedule.py defers_scoring): not with dynamic sampling, partial rollouts, turns.
    defer_scoring: bool = True
    # A reward fleet (reward.fleet_nodes > 0): its nodes and CPUs per node, whose product is pool_cores.
    fleet_nodes: int = 0
    fleet_cpus_per_node: int = 0

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
    allreduce_latency_s: float = 8e-6  # one small all-reduce inside a node (cluster.allreduce_latency_us)
    host_link_bytes_per_s: float = HOST_LINK_BYTES_PER_S
    gpu_hour_usd: float = 0.0  # on-demand; 0 = not priced
    spot_gpu_hour_usd: float = 0.0  # 0 = no spot option
    spot_preemptions_per_node_day: float = 0.0
    spare_nodes: int = 0  # allocated (and billed) beside the run's nodes, idle until one fails

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
    # How a mixture of experts' GEMMs run (models/experts.py): grouped with transformer-engine, which a GPU
    # cluster runs; per expert with the local layer spec (a CPU cluster).
    expert_gemm: str = GROUPED


@dataclass(frozen=True)
class CriticInputs:
    """PPO's value model (algorithm.name=ppo): a GPT body of `spec`'s shape with a one-output value head
    (no vocabulary-sized output layer), trained with its own AdamW on the trainer's GPUs, at the trainer's
    layout or its own TP x PP (DP the rest)."""

    spec: ModelSpec
    micro_batch_size: int  # critic.micro_batch_size, or optim.micro_batch_size when that is 0
    recompute: str = ""  # critic.recompute; "" = the layout's
    init: str = "policy"  # critic.init: the policy's weights, or an HF reward model's path
    tp: int = 0  # critic.tp; 0 = the trainer's
    pp: int = 0  # critic.pp; 0 = the trainer's


@dataclass(frozen=True)
class PlanInputs:
    name: str
    spec: ModelSpec
    work: Workload
    hw: Hardware
    assume: Assumptions
    # The models beside the policy on the trainer's GPUs (plan/models.py): PPO's critic, and a learned reward
    # model (an HF *ForSequenceClassification checkpoint, frozen, scored after generation). None: absent.
    critic: CriticInputs | None = None
    reward_model: ModelSpec | None = None
    reward_checkpoint: str = ""  # reward.model_checkpoint
    # Recipe keys whose model shape could not be read here and was taken to be the policy's (run.assumed).
    assumed: tuple[str, ...] = ()

    # ---- model numbers every module uses ----
    @property
    def params(self) -> int:
        """All parameters, unpadded vocabulary: what a published or exported copy holds."""
        return self.spec.num_params()

    @property
    def active_params(self) -> int:
        """Parameters one token's forward uses: all of a dense model; for a mixture of experts, the
        router and the token's top-k experts (the FLOPs follow these, the memory `params`)."""
        return self.spec.num_params(active=True)

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every layer and the output projection.

        The input embedding is a table lookup and costs no FLOPs; with tied embeddings the same
        matrix is still the output projection, so it is counted once either way. A mixture of
        experts counts the router and the top-k experts a token is routed to, not every expert.
        """
        s = self.spec
        return s.num_layers * s.layer_params(active=True) + s.vocab_size * s.hidden_size

    @property
    def expert_params(self) -> int:
        """Parameters of all the experts of all layers (0 for a dense model): what EP x ETP shards."""
        s = self.spec
        return s.num_layers * s.num_experts * s.expert_params() if s.is_moe else 0

    def decode_weight_bytes(self, batch: float) -> float:
        """Weight bytes one decode step of an engine replica reads with `batch` sequences in flight.

        Dense: all the weights. A mixture of experts reads its dense part (attention, router,
        embeddings) and only the experts its tokens are routed to: with top-k of E experts chosen
        uniformly, E·(1 - (1 - k/E)^batch) distinct experts per layer (all of them at large batch, k of
        them for one sequence)."""
        s = self.spec
        if not s.is_moe:
            return float(self.weights_bytes)
        e, k = s.num_experts, s.moe_topk
        touched = e * (1.0 - (1.0 - k / e) ** max(1.0, batch))
        dense = self.params - self.expert_params
        return (dense + s.num_layers * touched * s.expert_params()) * s.dtype_bytes

    @property
    def weights_bytes(self) -> int:
        return self.params * self.spec.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Attention's K and V only: a mixture of experts has the same KV cache as its dense shape."""
        return self.spec.kv_bytes_per_token()


def inputs_from_run(run) -> PlanInputs:
    """The planner's numbers from a resolved run (run/resolve.py) whose recipe has passed the one recipe
    check (megatron_rl/check/recipe.py, which `megatron-rl plan` runs first): values are not re-checked here."""
    recipe, spec = run.recipe, run.spec
    d, r, c, p, a = recipe.data, recipe.rollout, recipe.cluster, recipe.plan, recipe.algorithm
    # A second pass over the minibatches follows updates, as a second minibatch does (algorithms/old_policy.py).
    old_forward = needs_forward(a.old_logprobs, a.minibatches, a.kl_in_reward, a.kl_coef, a.epochs)
    fleet_cores = recipe.reward.fleet_nodes * recipe.reward.fleet_cpus_per_node
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
        old_forward=old_forward,
        # reward.kind=model: the reward model alone scores (on the trainer's GPUs), no verifier in the pool.
        seconds_per_sample=0.0 if recipe.reward.kind == "model" else recipe.reward.seconds_per_sample,
        pool_cores=fleet_cores or recipe.reward.pool_cores,
        fleet_nodes=recipe.reward.fleet_nodes,
        fleet_cpus_per_node=recipe.reward.fleet_cpus_per_node if recipe.reward.fleet_nodes else 0,
        steps=recipe.steps,
        turns=r.max_turns if r.env else 1,
        epochs=a.epochs,
        critic_epochs=recipe.critic.epochs or a.epochs,
        defer_scoring=defers_scoring(a, r, 0),  # a synchronous layout's; an asynchronous one overlaps all
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
        is_cpu=not run.on_gpu,
        allreduce_latency_s=c.allreduce_latency_us * 1e-6,
        gpu_hour_usd=c.gpu_hour_usd,
        spot_gpu_hour_usd=c.spot_gpu_hour_usd,
        spot_preemptions_per_node_day=c.spot_preemptions_per_node_day,
        spare_nodes=c.spare_nodes,
    )
    assume = Assumptions(
        train_mfu=p.train_mfu,
        generation_bw_fraction=p.generation_bw_fraction,
        prefix_sharing=p.prefix_sharing,
        gpu_memory_utilization=r.gpu_memory_utilization,
        kv_cache_bytes=r.kv_cache_bytes,
        sleep_level=run.sleep_level,
        distributed_optimizer=recipe.optim.distributed_optimizer,
        publish_pack_s=p.publish_pack_s,
        publish_install_s=p.publish_install_s,
        publish_validate_s=p.publish_validate_s,
        target_hours=p.target_hours,
        checkpoint_interval_steps=recipe.checkpoint.interval,
        async_save=recipe.checkpoint.async_save,
        reference=recipe.algorithm.reference,
        expert_gemm=expert_gemm(use_te=run.on_gpu),
    )
    critic = None
    if run.critic_spec is not None:
        cr = recipe.critic
        critic = CriticInputs(
            spec=run.critic_spec,
            micro_batch_size=cr.micro_batch_size or recipe.optim.micro_batch_size,
            recompute=cr.recompute,
            init=cr.init,
            tp=cr.tp,
            pp=cr.pp,
        )
    return PlanInputs(
        name=recipe.name,
        spec=spec,
        work=work,
        hw=hw,
        assume=assume,
        critic=critic,
        reward_model=run.reward_spec,
        reward_checkpoint=recipe.reward.model_checkpoint if run.reward_spec is not None else "",
        assumed=tuple(run.assumed),
    )
