"""The rules a parallel layout must follow, in one place.

`ParallelLayout.check` applies all of them for `validate`, `submit`, the planner, its layout search
and the driver; the reshard plan (`reshard/plan.py`) and the engine-side converter
(`reshard/convert.py`) apply the parts they need, so a layout one of them refuses is a layout
`validate` has refused first, with the same words. Each rule names the recipe key and the fix.
"""

from __future__ import annotations

from megatron_rl.config.problem import Problem

PLACEMENTS = ("colocated", "separated")
SYNCHRONIES = ("sync", "async")
RECOMPUTE_MODES = ("none", "selective", "full")
SIZES = ("tp", "pp", "dp", "cp", "ep", "etp", "engine_tp", "engine_count")
# vLLM pads its vocab-parallel embedding and LM head to a multiple of this, then splits it over TP.
ENGINE_VOCAB_PAD = 64


def megatron_split(layers: int, pp: int) -> list[int]:
    """Layers per PP stage as megatron-core builds them: an even middle, the rest on the first and last
    stages (`num_layers_in_first/last_pipeline_stage`)."""
    if pp == 1:
        return [layers]
    base = layers // pp
    rest = layers - base * pp
    return [base + rest - rest // 2] + [base] * (pp - 2) + [base + rest // 2]


def _p(key: str, value, message: str, kind: str = "recipe") -> Problem:
    return Problem(f"layout.{key}", value, message, kind)


def size_problems(layout) -> list[Problem]:
    """Enumerations and sizes: every later rule divides by these."""
    out = []
    for key, allowed in (
        ("placement", PLACEMENTS),
        ("synchrony", SYNCHRONIES),
        ("recompute", RECOMPUTE_MODES),
    ):
        if getattr(layout, key) not in allowed:
            out.append(_p(key, getattr(layout, key), f"must be one of {', '.join(allowed)}"))
    for key in SIZES:
        value = getattr(layout, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            out.append(_p(key, value, "must be an integer >= 1"))
    return out


def trainer_problems(layout, model) -> list[Problem]:
    """Trainer TP, PP, CP and EP against the model (megatron-core's sharding)."""
    out = []
    kv, tp = model.num_query_groups, layout.tp
    if kv % tp:
        divisors = [t for t in range(1, kv + 1) if kv % t == 0]
        out.append(
            _p(
                "tp",
                tp,
                f"megatron-core shards whole KV groups across TP, so layout.tp must divide "
                f"model.num_query_groups={kv} (KV groups < TP is not supported by the trainer); "
                f"use layout.tp in {divisors}",
            )
        )
    if model.ffn_hidden_size % tp:
        out.append(_p("tp", tp, f"must divide model.ffn_hidden_size={model.ffn_hidden_size}"))
    layers = model.num_layers
    if layout.pp_layers:
        split = layout.pp_layers
        if len(split) != layout.pp or sum(split) != layers or min(split) < 1:
            out.append(
                _p(
                    "pp_layers",
                    list(split),
                    f"needs layout.pp={layout.pp} entries (each >= 1) summing to model.num_layers={layers}",
                )
            )
        elif len(set(split[1:-1])) > 1:
            out.append(
                _p(
                    "pp_layers",
                    list(split),
                    "megatron-core takes an uneven split as first and last stage sizes and divides the "
                    f"middle stages evenly, so the middle entries must be equal (e.g. {megatron_split(layers, layout.pp)})",
                )
            )
    elif layers % layout.pp:
        even = megatron_split(layers, layout.pp)
        out.append(
            _p(
                "pp",
                layout.pp,
                f"does not divide model.num_layers={layers}; pick a divisor or give an explicit uneven split "
                f"in layout.pp_layers (e.g. {even})",
            )
        )
    if layout.cp > 1:
        out.append(
            _p(
                "cp",
                layout.cp,
                "context parallelism is not supported by this trainer yet; set layout.cp=1",
                "driver",
            )
        )
    return out + expert_problems(layout, model)


def expert_problems(layout, model) -> list[Problem]:
    """EP and ETP against the model and the trainer's grid (megatron-core's expert rank generator)."""
    experts = getattr(model, "num_experts", None) or 0
    if not experts:
        return [
            _p(key, getattr(layout, key), f"expert parallelism needs a mixture-of-experts model; this one "
               f"is dense; set layout.{key}=1")
            for key in ("ep", "etp")
            if getattr(layout, key) > 1
        ]  # fmt: skip
    out = []
    ep, etp = layout.ep, layout.etp
    if experts % ep:
        divisors = [d for d in range(1, experts + 1) if experts % d == 0]
        out.append(_p("ep", ep, f"must divide model.num_experts={experts} (each EP rank holds whole experts); "
                                f"use one of {divisors}"))  # fmt: skip
    stage = layout.tp * layout.cp * layout.dp
    if stage % (ep * etp):
        out.append(
            _p(
                "ep",
                ep,
                f"ep x etp = {ep * etp} must divide the tp x cp x dp = {stage} ranks of a pipeline stage "
                "(megatron-core carves the expert grid out of them); change layout.ep, layout.etp or layout.dp",
            )
        )
    ffn = model.moe_ffn_hidden_size or 0
    if ffn % etp:
        out.append(_p("etp", etp, f"must divide model.moe_ffn_hidden_size={ffn}"))
    if layout.tp > 1 and not layout.sequence_parallel:
        out.append(
            _p(
                "sequence_parallel",
                layout.sequence_parallel,
                f"must be true for a mixture-of-experts model at layout.tp={layout.tp}: megatron-core's MoE "
                "layer refuses to train at TP > 1 without sequence parallelism (each TP rank routes its own "
                "slice of the tokens); set layout.sequence_parallel=true",
            )
        )
    return out


def engine_problems(engine_tp: int, model, engine_ep: bool = False) -> list[Problem]:
    """Engine TP against the model (how vLLM shards heads, KV heads, the MLP and the vocabulary)."""
    out = []
    heads, kv = model.num_attention_heads, model.num_query_groups
    if heads % engine_tp:
        out.append(_p("engine_tp", engine_tp, f"must divide model.num_attention_heads={heads}"))
    if engine_tp > kv and engine_tp % kv:
        out.append(
            _p(
                "engine_tp",
                engine_tp,
                f"exceeds the {kv} KV heads and is not a multiple of them; vLLM replicates KV heads only "
                "when engine_tp is a multiple of num_query_groups",
            )
        )
    elif engine_tp <= kv and kv % engine_tp:
        out.append(_p("engine_tp", engine_tp, f"must divide model.num_query_groups={kv}"))
    if model.ffn_hidden_size % engine_tp:
        out.append(_p("engine_tp", engine_tp, f"must divide model.ffn_hidden_size={model.ffn_hidden_size}"))
    moe_ffn = getattr(model, "moe_ffn_hidden_size", None) or 0
    experts = getattr(model, "num_experts", None) or 0
    if engine_ep and not experts:
        out.append(_p("engine_ep", engine_ep, "places whole experts per engine rank; this model is dense"))
    elif engine_ep and experts % engine_tp:  # vLLM's expert parallelism: E / engine_tp experts per rank
        out.append(
            _p("engine_tp", engine_tp, f"must divide model.num_experts={experts} with layout.engine_ep")
        )
    elif not engine_ep and moe_ffn % engine_tp:  # every expert's FFN split over the engine's TP ranks
        out.append(_p("engine_tp", engine_tp, f"must divide model.moe_ffn_hidden_size={moe_ffn}"))
    padded = -(-model.vocab_size // ENGINE_VOCAB_PAD) * ENGINE_VOCAB_PAD
    if padded % engine_tp:
        out.append(
            _p(
                "engine_tp",
                engine_tp,
                f"must divide the vocabulary padded to {ENGINE_VOCAB_PAD} ({padded} rows)",
            )
        )
    return out


def placement_problems(layout) -> list[Problem]:
    """Placement and timing: what the layout asks of the driver."""
    out = []
    if layout.colocated and layout.engine_world > layout.trainer_world:
        out.append(
            _p(
                "engine_count",
                layout.engine_count,
                f"engine_tp x engine_count = {layout.engine_world} engine ranks exceed the {layout.trainer_world} "
                "trainer ranks they are colocated on; lower layout.engine_count or use layout.placement=separated",
            )
        )
    if layout.synchrony == "async" and layout.colocated:
        out.append(
            _p(
                "synchrony",
                layout.synchrony,
                "asynchrony overlaps generation with training, and colocated engines share the trainer's "
                "devices: there is nothing to overlap. Set layout.synchrony=sync, or layout.placement=separated",
            )
        )
    return out


def cluster_problems(layout, cluster) -> list[Problem]:
    """The layout against the machines: groups inside a node, one rank per GPU, every GPU used."""
    out = []
    per_node = cluster.gpus_per_node
    gpus = cluster.nodes * per_node
    et = layout.engine_tp
    if layout.tp > per_node or per_node % layout.tp:
        out.append(
            _p(
                "tp",
                layout.tp,
                f"does not fit inside one node of {per_node} GPUs: tensor-parallel groups all-reduce every "
                f"layer and must stay on a node's NVLink; use a divisor of {per_node}",
            )
        )
    if et > per_node or per_node % et:
        out.append(
            _p(
                "engine_tp",
                et,
                f"an engine must fit inside a node of {per_node} GPUs (engine_tp divides cluster.gpus_per_node)",
            )
        )
    if layout.colocated:
        if layout.trainer_world != gpus:
            unit = layout.tp * layout.pp * layout.cp
            nodes = layout.trainer_world // per_node
            fixes = [f"set layout.dp={gpus // unit}"] if gpus % unit == 0 else []
            if nodes and layout.trainer_world % per_node == 0:
                fixes.append(f"set cluster.nodes={nodes}")
            out.append(
                _p(
                    "dp",
                    layout.dp,
                    f"trainer world tp x pp x dp x cp = {layout.trainer_world} must equal cluster.nodes x "
                    f"cluster.gpus_per_node = {gpus} (one rank per GPU); "
                    + (" or ".join(fixes) if fixes else "change tp/pp/dp or the cluster size"),
                )
            )
        if layout.engine_world != gpus and layout.engine_world <= layout.trainer_world:
            out.append(
                _p(
                    "engine_count",
                    layout.engine_count,
                    f"engine_tp x engine_count = {layout.engine_world} must cover the {gpus} GPUs when "
                    f"colocated; set layout.engine_count={max(gpus // et, 1)}",
                )
            )
    elif layout.trainer_world + layout.engine_world != gpus:
        out.append(
            _p(
                "engine_count",
                layout.engine_count,
                f"trainer ({layout.trainer_world}) + engine ({et} x {layout.engine_count}) GPUs must equal the "
                f"cluster's {gpus} (cluster.nodes x cluster.gpus_per_node)",
            )
        )
    return out
