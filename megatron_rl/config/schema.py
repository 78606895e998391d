"""Typed schemas for every Hydra config group.

Each group under `conf/` (model, layout, algorithm, rollout, reward, data, optim, checkpoint,
logger, cluster, plan) is backed by one dataclass here. Hydra merges YAML into these structured
configs, so an unknown key or a wrong type fails at load time with the key's full path, long
before any process allocates model memory. Cross-field checks (divisibility, world size, memory
fit) live in `megatron_rl/check/recipe.py`, and every numeric key here has its range there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class ModelConfig:
    """Architecture of a decoder-only transformer (Llama-3, Qwen2/2.5, Qwen3 families).

    With `hf_checkpoint` set, the checkpoint's config.json is the truth: a key left null here is read
    from it, and a key given here must agree with it (models/resolve.py). Without one, the recipe
    states the shape; the other keys take their family's defaults.
    """

    name: str = ""  # defaults to the checkpoint folder's name
    family: str | None = None  # llama | qwen2 | qwen3 | qwen3_moe: selects HF naming and QKV bias / QK norm
    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None  # KV heads
    head_dim: int | None = None  # defaults to hidden_size // num_attention_heads
    vocab_size: int | None = None
    # Megatron pads the vocabulary so every TP rank holds an equal slice that is a multiple of this.
    make_vocab_size_divisible_by: int = 128
    max_position_embeddings: int | None = None  # default 4096
    rope_theta: float | None = None  # default 10000
    norm_eps: float | None = None  # default 1e-6
    qkv_bias: bool | None = None  # default: the family's (Qwen2 true)
    qk_norm: bool | None = None  # default: the family's (Qwen3 true)
    tie_word_embeddings: bool | None = None  # default false
    # RoPE scaling: none | llama3 (Llama-3.1: the frequencies below the original context are slowed by
    # `rope_scaling_factor`, with a smooth band between the low and high frequency factors).
    rope_scaling: str | None = None  # default none
    rope_scaling_factor: float | None = None
    rope_low_freq_factor: float | None = None
    rope_high_freq_factor: float | None = None
    rope_original_max_position: int | None = None
    # Mixture of experts (family qwen3_moe; read from the checkpoint when it is set): experts per layer,
    # each expert's FFN width, experts per token, and whether the top-k router weights are renormalised.
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_topk: int | None = None
    moe_norm_topk_prob: bool | None = None
    # Router losses added to the RL loss (0 = off): the load-balancing loss and the router z-loss.
    moe_aux_loss_coeff: float = 0.0
    moe_z_loss_coeff: float = 0.0
    params_dtype: str = "bf16"  # bf16 | fp32 | fp16
    # Path to an HF safetensors directory to import at start; None = random init (tiny recipes).
    hf_checkpoint: str | None = None
    # CPU demos and tests: build a tiny random checkpoint of this family (qwen2 | qwen3 | llama) at
    # hf_checkpoint when none is there (`launch_local`; models/fixture.py). Empty = never.
    fixture: str = ""


@dataclass
class LayoutConfig:
    """Trainer parallelism and the colocated or separated rollout engines."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1  # expert parallel (mixture-of-experts models): carved out of TP x DP
    etp: int = 1  # expert tensor parallel: the experts' own TP size (1 = whole experts per rank)
    # Explicit uneven PP split: layers per stage, e.g. [15, 17, 16, 16]; empty = even split.
    pp_layers: list[int] = field(default_factory=list)
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective | full
    engine_tp: int = 1
    engine_count: int = 1
    # Mixture of experts: each engine rank holds E / engine_tp whole experts (vLLM's expert parallelism,
    # `enable_expert_parallel`) instead of every expert's FFN split over engine_tp. GPU engines only.
    engine_ep: bool = False
    placement: str = (
        "colocated"  # colocated | separated (engines on engine_tp x engine_count GPUs of their own)
    )
    # sync | async (separated only: the engines draw up to rollout.max_staleness batches ahead)
    synchrony: str = "sync"


@dataclass
class AlgorithmConfig:
    """GRPO and its relatives: advantages, clipped surrogate, KL, loss aggregation."""

    name: str = "grpo"
    advantage_std_norm: bool = True  # False = Dr.GRPO
    clip_low: float = 0.2
    clip_high: float = 0.2  # > clip_low = DAPO clip-higher
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # k1 | k2 | k3
    kl_in_reward: bool = False  # True: KL as a reward penalty; False: as a loss term
    loss_agg: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    minibatches: int = 1
    # The ratio's denominator (algorithms/old_policy.py): recompute = a trainer forward before the first
    # update; auto = skip it when the update's own forward gives the same values (one minibatch, no KL
    # in the rewards); engine = the engines' sampling log-probs. The agreement is measured in every case.
    old_logprobs: str = "auto"  # recompute | engine | auto
    dynamic_sampling: bool = False
    max_resample_rounds: int = 3
    overlong: str = "none"  # none | mask | penalty
    overlong_penalty_tokens: int = 0
    truncated_is_cap: float = 0.0  # 0 = off; else cap on the rollout/old-policy ratio
    # Mixture-of-experts models: the trainer's forwards (old-policy, reference, every update) use the
    # experts the engine routed each token to, instead of choosing their own (trainer/replay.py).
    routing_replay: bool = False
    # The frozen reference (kl_coef > 0): "resident" keeps its weights on the GPU; "offload" keeps
    # them in host memory and brings them over only for the reference log-probs (the planner counts
    # whichever is chosen).
    reference: str = "resident"  # resident | offload
    # Passes over the step's minibatches (each minibatch one optimizer step of the policy, and of the critic
    # with PPO); more than one pass needs the old log-probs recomputed before the first.
    epochs: int = 1
    # PPO (name=ppo; the critic is the `critic` group): per-token advantages by generalised advantage
    # estimation (algorithms/gae.py), gamma the discount and lam the bias/variance trade-off; the sequence's
    # reward lands on its last generated token. value_clip: the clipped value loss keeps the new value
    # within this of the old one (0 = unclipped). advantage_whiten: batch = mean 0 and std 1 over the
    # step's generated tokens, scale = std 1 with the mean kept, none. GRPO takes none of these.
    gamma: float = 1.0
    lam: float = 0.95
    value_clip: float = 0.2
    advantage_whiten: str = "batch"  # batch | scale | none


@dataclass
class CriticConfig:
    """PPO's value model (algorithm.name=ppo): a GPT body with one scalar per token (trainer/value.py), trained
    by the clipped value loss with its own AdamW and LR schedule, at the trainer's layout or its own.

    `init`: "policy" starts from the policy's weights (its LM head replaced by a zero value head); a path to
    an HF `*ForSequenceClassification` checkpoint (a reward model) starts from that, score head included."""

    init: str = "policy"
    lr: float = 1e-6
    min_lr: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    warmup_steps: int = 20  # RL steps of linear LR warm-up, as optim.warmup_steps
    lr_schedule: str = "constant"  # constant | cosine
    # RL steps at the start in which only the critic trains (the policy waits for useful values); they
    # still generate and score, and count toward `steps`.
    critic_only_steps: int = 0
    # Passes of the critic over the step's minibatches (0 = algorithm.epochs): a critic that lags a moving
    # policy takes more steps on the same returns than the policy does.
    epochs: int = 0
    # The critic's layout on the trainer's ranks: tp and pp 0 = the trainer's (megatron-core's global groups);
    # others give it groups of its own, DP the rest (trainer/model_groups.py: dense, no context parallelism).
    # Its own micro-batch size and activation recompute.
    tp: int = 0
    pp: int = 0
    micro_batch_size: int = 0  # 0 = optim.micro_batch_size
    recompute: str = ""  # "" = layout.recompute; none | selective | full


@dataclass
class RolloutConfig:
    """Sampling and engine settings."""

    engine: str = "vllm"
    samples_per_prompt: int = 8
    max_new_tokens: int = 512
    # Expected mean completion length (planner only; the engine stops at max_new_tokens).
    mean_completion_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs_mode: str = "processed_logprobs"  # processed_logprobs | raw_logprobs
    gpu_memory_utilization: float = 0.5
    kv_cache_bytes: int = 0  # CPU build: KV cache size in bytes (0 = engine default)
    # 0 = chosen by the publication's delivery: 2 (discard weights) with in-place delivery, which
    # overwrites every weight anyway; 1 (weights to host and back) with loader delivery.
    sleep_level: int = 0  # 0 | 1 | 2
    enforce_eager: bool = True
    seed: int = 0
    # The engines' dtype: "" = the trainer's model.params_dtype; bf16 | fp16 | fp32 (e.g. a bf16 engine
    # serving an fp32 trainer: the publication casts as it lands).
    dtype: str = ""
    # The engines' and the trainer's log-probs of the same tokens must agree (rollout/agreement.py): on a
    # probe of every publication before it serves (loop/placement/probe.py) and on every step's samples. Thresholds
    # in nats on the max and the mean |trainer - engine|; 0 = set by the dtype pair (validate --json).
    logprob_max_gap: float = 0.0
    logprob_mean_gap: float = 0.0
    # What a disagreement does: refuse = the version is refused like a failed publication (the previous
    # one keeps serving; on_refused_publication decides what follows); stop = end the run; warn = report.
    on_logprob_disagreement: str = "refuse"  # refuse | stop | warn
    # The probe: this many fixed sequences of logprob_probe_tokens token ids (at most the engines' context),
    # scored by every engine (a prefill) and by the trainer; 0 = no probe (a faulty version then serves a
    # step before the step's own check sees it).
    logprob_probe_prompts: int = 4
    logprob_probe_tokens: int = 32
    # A refused publication (NaN/Inf weights, a corrupt, missing or duplicated tensor, a version that
    # does not increase) leaves the previous version serving. Then: stop = sample with it until
    # max_refused_publications refusals in a row, then end the run; skip = always sample with it (the
    # step record says so); retry = publish again at once, ending the run after that many in a row.
    on_refused_publication: str = "stop"  # stop | skip | retry
    max_refused_publications: int = 3
    # layout.synchrony=async: how many steps the engines run ahead of the trainer; every batch is then
    # trained at most k updates after the policy that sampled it (parallel/schedule.py). The driver draws
    # one batch per step, so 1 is the one value `validate` takes (more would add lag, not overlap).
    max_staleness: int = 1
    # Over-sampling against the long tail: draw ceil(oversample x prompts) per step and train on the
    # first groups whose samples have all finished; the rest are cut and dropped. Biased toward prompts
    # with short completions (the groups that finish last are the long ones): see README.
    oversample: float = 1.0
    # Partial rollouts (needs oversample > 1): the groups still running when the batch's first groups
    # have finished are cut, not dropped: their tokens (with log-probs and versions) are kept and the next
    # batch continues them first under the newer version (loop/step/carry.py). A group cut partial_max_cuts
    # times is not cut again: the batch waits for it, which bounds a token's age.
    partial: bool = False
    partial_max_cuts: int = 2
    # Multi-turn rollouts (rollout/turns.py): an environment answers each turn (env/): "" = single-turn;
    # code_feedback | expression_feedback | tool_calls | module:Class (your own). max_new_tokens then caps
    # the whole trajectory after the prompt (turns and observations); turn_max_tokens one turn (0: none
    # beyond what is left); observation_max_tokens one observation (its end kept). turn_penalty: reward
    # taken off per turn after the first (shaping; 0 = one reward per trajectory, unshaped).
    env: str = ""
    max_turns: int = 1
    turn_max_tokens: int = 0
    observation_max_tokens: int = 256
    turn_penalty: float = 0.0
    # An environment step (a turn's sandbox run, queued behind the others) that takes longer ends its
    # trajectory with status env_error; the run goes on.
    env_timeout_s: float = 600.0


@dataclass
class RewardConfig:
    """How completions are scored."""

    kind: str = "sandbox"  # sandbox | function | model | http
    function: str = ""  # module:function for kind=function
    # The reward fleet (reward/remote.py): reward servers (`megatron-rl reward-server`) on CPU nodes score
    # the samples instead of local sandboxes. `endpoints`: host:port of each; `endpoints_file`: a file
    # with one host:port per line (the sbatch script writes it as the fleet comes up), waited for up to
    # `endpoints_wait_s`. Each sample goes to the least-loaded server; a failed or vanished one's samples
    # go to another, up to `remote_attempts` sends per sample, each with `remote_timeout_s`.
    endpoints: list[str] = field(default_factory=list)
    endpoints_file: str = ""
    endpoints_wait_s: float = 300.0
    remote_timeout_s: float = 120.0
    remote_attempts: int = 5
    # kind=http: POST {"prompt", "completion", "problem_id", "answer"} to `url` (an LLM judge or a
    # reward-model server), which answers {"reward": float} (and optionally "status"); `http_timeout_s`
    # per request, `http_retries` more tries on a connection error, a timeout or a 5xx; a bearer token
    # from the environment variable `http_token_env` when set.
    url: str = ""
    http_timeout_s: float = 30.0
    http_retries: int = 2
    http_token_env: str = ""
    # A learned reward model (trainer/reward_model.py): an HF `*ForSequenceClassification` checkpoint with one
    # label, scored on the trainer's devices after generation (frozen, on the host between uses like an
    # offloaded reference). kind=model: the reward is model_weight x its score. With kind sandbox or
    # function and a model_checkpoint, the reward is verifier_weight x the verifier's + model_weight x the
    # model's. Its tokenizer must be the policy's.
    model_checkpoint: str = ""
    model_weight: float = 1.0
    verifier_weight: float = 1.0
    mode: str = "all_or_nothing"  # all_or_nothing | fraction
    unsafe_local: bool = False  # run untrusted code without bubblewrap (loudly warned)
    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 512
    # Pool sizing for the planner: cores in the scoring pool and seconds per sample.
    pool_cores: int = 2
    seconds_per_sample: float = 0.5
    # A reward fleet of `fleet_nodes` CPU nodes of `fleet_cpus_per_node` CPUs (0: none). Without
    # reward.endpoints(_file), the job starts it: `megatron-rl submit` asks Slurm for them as a second
    # component of a heterogeneous job on `fleet_partition` (empty: the cluster's default partition), and
    # slurm/train.sbatch runs a reward-server on each and hands the ranks their endpoints. With endpoints
    # given, the fleet is one already running and these keys only size it for the planner, which scores
    # with it in place of reward.pool_cores and says when it is the bottleneck.
    fleet_nodes: int = 0
    fleet_cpus_per_node: int = 64
    fleet_partition: str = ""


@dataclass
class DataConfig:
    """Prompts and their tests."""

    # bundled | synthetic | a .jsonl/.json/.parquet file | a folder saved by datasets' save_to_disk |
    # a folder of such files | a glob of them (the rule: megatron_rl/data/sources.py)
    source: str = "bundled"
    # Our field names (id, prompt, tests, input_output, entry_point, timeout_s, answer) to the data's
    # column names, e.g. {prompt: question, input_output: io}; unmapped fields keep their own names.
    # On the command line: data.columns.prompt=question (an entry is added or replaced: config/keys.py).
    columns: dict[str, str] = field(default_factory=dict)
    # A system message put before each prompt when the tokenizer has a chat template; without one it is
    # put before the prompt as plain text, followed by a blank line. Empty: no system message.
    system_prompt: str = ""
    prompts_per_step: int = 8
    prompt_tokens: int = 64  # expected prompt length (planner)
    max_prompt_tokens: int = 256
    shuffle: bool = True
    seed: int = 0
    # data.source=synthetic only: a long-tailed mix of answer lengths (benchmarks/async.py). A share
    # `tail_share` of the prompts ask for answers of up to rollout.max_new_tokens; the others are capped
    # at `short_answer_tokens`. 0: every prompt's answer may run to rollout.max_new_tokens.
    tail_share: float = 0.0
    short_answer_tokens: int = 4
    # data.source=synthetic only: prompts do not show the target ("<bos>="), so only feedback can tell it
    # (rollout.env=expression_feedback, the multi-turn demo: recipes/grpo_tiny_multiturn_cpu.yaml).
    hidden_target: bool = False


@dataclass
class OptimConfig:
    """AdamW and its LR schedule (megatron-core's OptimizerParamScheduler, trainer/policy.py).

    Defaults are the usual GRPO ones: beta2 0.95 (the second moment forgets a noisy RL gradient
    faster than 0.999), clip 1.0, a 20-step linear warm-up, then a constant LR."""

    lr: float = 1e-6
    min_lr: float = 0.0  # cosine only: the LR at the run's last optimizer step
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    # RL steps (not optimizer steps: each RL step takes algorithm.minibatches of those) over which the
    # LR ramps linearly from 0 to lr, one increment per optimizer step.
    warmup_steps: int = 20
    # After warm-up: constant = lr to the end; cosine = from lr down to min_lr at the last of the
    # run's `steps` x algorithm.minibatches optimizer steps.
    lr_schedule: str = "constant"  # constant | cosine
    distributed_optimizer: bool = True
    micro_batch_size: int = 1


@dataclass
class CheckpointConfig:
    dir: str = "checkpoints"
    interval: int = 0  # steps between saves; 0 = never; -1 = the planner's Young/Daly interval
    keep_last: int = 2
    keep_every: int = 0
    resume: str = "auto"  # auto | none | a path
    async_save: bool = True


@dataclass
class LoggerConfig:
    wandb: bool = True
    project: str = "megatron-rl"
    group: str = ""  # defaults to the recipe name
    run_dir: str = "outputs"
    progress: bool = True
    # Steps in a row whose every group got one reward (nothing to learn from) before the run says so, once,
    # naming the likely cause (loop/record/signal.py); 0: never.
    no_signal_steps: int = 3
    # Completions kept per step, with prompt, reward and status, in <run dir>/samples.jsonl and a W&B table.
    samples_per_step: int = 4


@dataclass
class ClusterConfig:
    """The machines: used by validation, the planner and `megatron-rl submit`."""

    name: str = "cpu"
    nodes: int = 1
    gpus_per_node: int = 2
    gpu: str = "cpu"
    gpu_memory_gib: float = 80.0
    hbm_bandwidth_tbps: float = 3.35  # TB/s
    peak_tflops_bf16: float = 989.0  # dense
    nvlink_gbps: float = 900.0  # GB/s per GPU, intra-node
    ib_gbps_per_nic: float = 400.0  # Gb/s
    nics_per_node: int = 8
    storage_gbps: float = 20.0  # GB/s total, shared storage
    node_mtbf_days: float = 20.0
    # Prices for `megatron-rl plan`'s cost section, per GPU-hour in US dollars: on-demand, and spot
    # (0: no spot option) with how often the provider takes back one spot node per day. 0 on-demand:
    # the plan shows GPU-hours instead of dollars.
    gpu_hour_usd: float = 0.0
    spot_gpu_hour_usd: float = 0.0
    spot_preemptions_per_node_day: float = 0.0
    # Latency of one collective of the trainer's process groups inside a node (NCCL over NVLink: a few
    # microseconds; gloo between processes sharing CPU cores: a millisecond). The planner charges it per
    # tensor-parallel collective of the trainer's passes, so small models avoid TP where it costs.
    allreduce_latency_us: float = 8.0
    partition: str = ""
    account: str = ""
    time_limit: str = "48:00:00"
    container_image: str = ""
    # Process-group timeout: fast ranks wait in a collective for the slowest (an engine finishing a
    # 16k-token completion), so it must exceed the longest phase.
    dist_timeout_s: float = 1800.0
    # `megatron-rl preflight` (run by slurm/train.sbatch before the ranks): the fraction of the figures
    # above each node must reach: its matmul rate of peak_tflops_bf16, its copy bandwidth of
    # hbm_bandwidth_tbps, its all-reduce bus bandwidth of nvlink_gbps (in the node) and of the NIC
    # bandwidth per GPU (across nodes). Healthy H100s reach about 0.6-0.75, 0.8-0.9 and 0.4-0.5.
    preflight_gemm_fraction: float = 0.5
    preflight_memory_fraction: float = 0.6
    preflight_allreduce_fraction: float = 0.3
    # Failures at scale (slurm/train.sbatch, megatron_rl/system/failover.py): `megatron-rl submit` asks for
    # `nodes + spare_nodes` nodes; the run uses `nodes` of them. A node whose rank died, hung or failed the
    # preflight is left out and the run continues from its newest checkpoint on a spare, as a new job step
    # (no queue wait), at most `max_restarts` times per job.
    spare_nodes: int = 0
    max_restarts: int = 3


@dataclass
class PlanConfig:
    """Planner assumptions and the target the run must meet."""

    train_mfu: float = 0.40
    generation_bw_fraction: float = 0.75
    target_hours: float = 48.0  # the run's `steps` must fit in it
    publish_pack_s: float = 0.0
    publish_install_s: float = 0.0
    publish_validate_s: float = 0.0
    prefix_sharing: bool = True


@dataclass
class RecipeConfig:
    """A complete recipe: every group plus run-level settings."""

    name: str = MISSING
    steps: int = 10
    seed: int = 1234
    model: ModelConfig = field(default_factory=ModelConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)


GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "layout": LayoutConfig,
    "algorithm": AlgorithmConfig,
    "critic": CriticConfig,
    "rollout": RolloutConfig,
    "reward": RewardConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "checkpoint": CheckpointConfig,
    "logger": LoggerConfig,
    "cluster": ClusterConfig,
    "plan": PlanConfig,
}


def register_configs() -> None:
    """Register the recipe schema and each group's schema in Hydra's ConfigStore.

    Called explicitly by the loader (never at import), so importing the package has no side effects.
    """
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="recipe_schema", node=RecipeConfig)
    for group, node in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=node)
