"""Cross-field checks on a recipe, run before any process allocates model memory.

Hydra's structured configs already refuse unknown keys and wrong types. What they cannot see are
relations between fields: heads vs TP, layers vs PP, world size vs the cluster, batch vs
minibatches vs DP, lengths vs context, memory vs the GPU. Each failure names the key, its value and
a fix; all failures are collected so a user fixes a recipe in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_rl.config.schema import RecipeConfig
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for

MIN_DIST_TIMEOUT_S = 60.0
ENUMS = {
    "model.family": ("llama", "qwen2", "qwen3"),
    "model.params_dtype": ("bf16", "fp16", "fp32"),
    "layout.placement": ("colocated", "separated"),
    "layout.synchrony": ("sync", "one_step_async"),
    "layout.recompute": ("none", "selective", "full"),
    "algorithm.kl_estimator": ("k1", "k2", "k3"),
    "algorithm.loss_agg": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "algorithm.overlong": ("none", "mask", "penalty"),
    "rollout.logprobs_mode": ("processed_logprobs", "raw_logprobs"),
    "rollout.on_refused_publication": ("stop", "skip", "retry"),
    "rollout.sleep_level": (0, 1, 2),
    "algorithm.reference": ("resident", "offload"),
    "reward.kind": ("sandbox", "function"),
    "reward.mode": ("all_or_nothing", "fraction"),
    "checkpoint.resume": None,  # free-form: auto | none | path
}


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    message: str  # what is wrong and how to fix it

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.message}"


class ConfigError(ValueError):
    """A recipe that cannot run; lists every problem found."""

    def __init__(self, problems: list[Problem], recipe: str = ""):
        self.problems = problems
        head = f"recipe {recipe!r} is invalid" if recipe else "invalid recipe"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))


def _get(cfg: RecipeConfig, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def check_recipe(cfg: RecipeConfig) -> list[Problem]:
    """Every problem of a recipe (empty list = valid)."""
    out: list[Problem] = []

    def bad(key: str, message: str) -> None:
        out.append(Problem(key, _get(cfg, key), message))

    for key, allowed in ENUMS.items():
        if allowed is not None and _get(cfg, key) not in allowed:
            bad(key, f"must be one of {', '.join(map(str, allowed))}")

    m, lay, ro, alg, data, cl, opt = (
        cfg.model,
        cfg.layout,
        cfg.rollout,
        cfg.algorithm,
        cfg.data,
        cfg.cluster,
        cfg.optim,
    )
    for key in (
        "layout.tp",
        "layout.pp",
        "layout.dp",
        "layout.cp",
        "layout.engine_tp",
        "layout.engine_count",
        "cluster.nodes",
        "cluster.gpus_per_node",
        "rollout.samples_per_prompt",
        "rollout.max_refused_publications",
        "data.prompts_per_step",
        "algorithm.minibatches",
        "optim.micro_batch_size",
        "model.num_layers",
    ):
        if _get(cfg, key) < 1:
            bad(key, "must be >= 1")
    if out:
        return out  # the checks below divide by these

    # ---- model shape ----
    if m.num_attention_heads % m.num_query_groups:
        bad("model.num_query_groups", f"must divide model.num_attention_heads={m.num_attention_heads}")
    head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
    if m.head_dim is None and m.hidden_size % m.num_attention_heads:
        bad(
            "model.hidden_size",
            f"is not a multiple of num_attention_heads={m.num_attention_heads}; set model.head_dim",
        )

    # ---- trainer TP / PP ----
    if m.num_query_groups % lay.tp:
        fix = (
            f"megatron-core shards whole KV groups across TP, so layout.tp must divide "
            f"model.num_query_groups={m.num_query_groups} (KV groups < TP is not supported by the trainer); "
            f"use layout.tp in {[t for t in range(1, m.num_query_groups + 1) if m.num_query_groups % t == 0]}"
        )
        bad("layout.tp", fix)
    if m.ffn_hidden_size % lay.tp:
        bad("layout.tp", f"must divide model.ffn_hidden_size={m.ffn_hidden_size}")
    if lay.pp_layers:
        if len(lay.pp_layers) != lay.pp or sum(lay.pp_layers) != m.num_layers:
            bad("layout.pp_layers", f"needs {lay.pp} entries summing to model.num_layers={m.num_layers}")
    elif m.num_layers % lay.pp:
        bad(
            "layout.pp",
            f"does not divide model.num_layers={m.num_layers}; pick a divisor or give an explicit uneven split "
            f"in layout.pp_layers (e.g. {_uneven(m.num_layers, lay.pp)})",
        )
    if lay.cp > 1:
        bad("layout.cp", "context parallelism is not supported by this trainer yet; set layout.cp=1")

    # ---- engines ----
    et = lay.engine_tp
    if m.num_attention_heads % et:
        bad("layout.engine_tp", f"must divide model.num_attention_heads={m.num_attention_heads}")
    if et > m.num_query_groups and et % m.num_query_groups:
        bad(
            "layout.engine_tp",
            f"exceeds the {m.num_query_groups} KV heads and is not a multiple of them; "
            "vLLM replicates KV heads only when engine_tp is a multiple of num_query_groups",
        )
    elif et <= m.num_query_groups and m.num_query_groups % et:
        bad("layout.engine_tp", f"must divide model.num_query_groups={m.num_query_groups}")

    # ---- world size vs cluster ----
    trainer_world = lay.tp * lay.pp * lay.dp * lay.cp
    gpus = cl.nodes * cl.gpus_per_node
    if lay.placement == "colocated":
        if trainer_world != gpus:
            bad(
                "layout.dp",
                f"trainer world tp x pp x dp x cp = {trainer_world} must equal cluster.nodes x "
                f"cluster.gpus_per_node = {gpus}; set layout.dp={max(gpus // (lay.tp * lay.pp * lay.cp), 1)} "
                "or change the cluster size",
            )
        if et * lay.engine_count != gpus:
            bad(
                "layout.engine_count",
                f"engine_tp x engine_count = {et * lay.engine_count} must cover the "
                f"{gpus} GPUs when colocated; set layout.engine_count={max(gpus // et, 1)}",
            )
        if et > cl.gpus_per_node or cl.gpus_per_node % et:
            bad(
                "layout.engine_tp",
                f"a colocated engine must fit inside a node of {cl.gpus_per_node} GPUs "
                "(engine_tp divides gpus_per_node)",
            )
    else:
        if trainer_world + et * lay.engine_count != gpus:
            bad(
                "layout.engine_count",
                f"trainer ({trainer_world}) + engine ({et} x {lay.engine_count}) GPUs must "
                f"equal the cluster's {gpus}",
            )

    # ---- batch ----
    samples = data.prompts_per_step * ro.samples_per_prompt
    if ro.samples_per_prompt < 2 and alg.name == "grpo":
        bad("rollout.samples_per_prompt", "GRPO needs >= 2 samples per prompt (group-relative advantages)")
    if samples % alg.minibatches:
        bad(
            "algorithm.minibatches",
            f"must divide the {samples} samples per step "
            f"(data.prompts_per_step x rollout.samples_per_prompt)",
        )
    else:
        per_mb = samples // alg.minibatches
        unit = lay.dp * opt.micro_batch_size
        if per_mb % unit:
            bad(
                "optim.micro_batch_size",
                f"each minibatch of {per_mb} samples must split evenly over "
                f"layout.dp={lay.dp} ranks x micro_batch_size={opt.micro_batch_size}",
            )

    # ---- lengths ----
    if data.max_prompt_tokens + ro.max_new_tokens > m.max_position_embeddings:
        bad(
            "rollout.max_new_tokens",
            f"data.max_prompt_tokens ({data.max_prompt_tokens}) + max_new_tokens "
            f"exceeds model.max_position_embeddings={m.max_position_embeddings}",
        )
    if ro.mean_completion_tokens > ro.max_new_tokens:
        bad("rollout.mean_completion_tokens", f"exceeds rollout.max_new_tokens={ro.max_new_tokens}")
    if alg.clip_low < 0 or alg.clip_high < 0:
        bad("algorithm.clip_low", "clip ranges must be >= 0")
    if ro.temperature <= 0:
        bad("rollout.temperature", "must be > 0 (log-probs are taken at this temperature)")
    if not 0 < ro.top_p <= 1:
        bad("rollout.top_p", "must be in (0, 1]")
    if alg.kl_coef < 0:
        bad("algorithm.kl_coef", "must be >= 0")
    if cfg.reward.kind == "function" and ":" not in cfg.reward.function:
        bad("reward.function", "must name a module:function for reward.kind=function")
    if head_dim <= 0:
        bad("model.head_dim", "must be > 0")
    if not MIN_DIST_TIMEOUT_S <= cl.dist_timeout_s < float("inf"):
        bad(
            "cluster.dist_timeout_s",
            f"must be at least {MIN_DIST_TIMEOUT_S:.0f} s (seconds a rank may wait in a collective for the "
            "slowest rank; 1800 is the default, raise it for very long completions)",
        )
    # `skip` samples with the previous version after a refusal; a level-2 sleep has discarded it by then
    level = sleep_level_for(ro.sleep_level, delivery_for(on_gpu=cl.gpu != "cpu"))
    if ro.on_refused_publication == "skip" and level == 2:
        bad(
            "rollout.on_refused_publication",
            "skip samples with the previous version after a refusal, but at sleep level 2 (the GPU default "
            "with in-place delivery) the engines discard its weights while training; set "
            "rollout.sleep_level=1 (weights kept on the host) or use stop/retry",
        )
    if not out:
        out += _memory_problems(cfg)
    return out


def _uneven(layers: int, pp: int) -> list[int]:
    base, extra = divmod(layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def _memory_problems(cfg: RecipeConfig) -> list[Problem]:
    """Memory fit from the planner's model (skipped for the CPU cluster, whose 'GPU' is host RAM)."""
    if cfg.cluster.gpu == "cpu":
        return []
    try:
        from megatron_rl.plan.memory import memory_per_gpu
    except ImportError:
        return []
    mem = memory_per_gpu(cfg)
    cap = cfg.cluster.gpu_memory_gib
    trainer, engine = mem["trainer_per_gpu"], mem["engine_per_gpu"]
    # Colocated: the engine sleeps while the trainer trains, so each must fit on its own.
    worst = max(trainer, engine) if cfg.layout.placement == "colocated" else trainer
    if worst > cap:
        return [
            Problem(
                "layout.tp",
                cfg.layout.tp,
                f"predicted memory {worst:.1f} GiB per GPU (trainer "
                f"{trainer:.1f}, engine {engine:.1f}) exceeds cluster.gpu_memory_gib={cap}; raise tp/pp, "
                "use layout.recompute=full, or more GPUs (`megatron-rl plan` shows the breakdown)",
            )
        ]
    # Colocated: vLLM claims gpu_memory_utilization x the GPU at construction, beside the trainer's params.
    util = cfg.rollout.gpu_memory_utilization
    kept = mem["trainer"]["resident_at_engine_construction"]
    if cfg.layout.placement == "colocated" and kept + util * cap > cap:
        return [
            Problem(
                "rollout.gpu_memory_utilization",
                util,
                f"building the engine claims {util} x {cap} GiB while the trainer keeps {kept:.1f} GiB of "
                f"params per GPU: {kept + util * cap:.1f} GiB > {cap} GiB; lower it to at most "
                f"{(cap - kept) / cap:.2f} or raise layout.tp/pp",
            )
        ]
    return []


def validate_recipe(cfg: RecipeConfig) -> RecipeConfig:
    """Raise ConfigError listing every problem; return the recipe when valid."""
    problems = check_recipe(cfg)
    if problems:
        raise ConfigError(problems, getattr(cfg, "name", ""))
    return cfg
