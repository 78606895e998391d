"""Memory per GPU: trainer (params, grads, optimizer, activations) and engine (weights, KV cache).

Trainer, per GPU, on its heaviest pipeline stage (bytes per parameter of that stage's TP shard; a
mixture of experts holds its dense part / TP and its experts / (EP x ETP), and the distributed
optimizer shards the experts' state over expert-DP = TP x CP x DP / (EP x ETP) instead of DP x CP):
  params      2 (bf16) or 4 (fp32)
  grads       4: megatron keeps fp32 main grads in its DDP buffer
  optimizer   12 (fp32 master copy, Adam m and v) or 8 for fp32 params, divided by DP x CP
              when the distributed optimizer shards it
  activations per layer and token, in the parameter dtype, what backward needs (flash-style
              attention keeps Q, K, V and its output, not the score matrix):
                selective  norm inputs and outputs 4h, Q and attention output 2q, K and V 2kv,
                           SwiGLU gate, up and product 3f; /TP with sequence parallelism (else the
                           4h part is replicated on every TP rank); /CP
                none       selective + the unfused softmax output, heads/TP x S per token
                           (megatron's local spec materialises it; "selective" is what drops it)
                full       only each layer's input h/TP, plus one layer's selective set while it
                           is being recomputed
              for one microbatch of the *longest* sequence (prompt cap + completion cap), times
              the microbatches a 1F1B stage i holds in flight (min(PP - i, microbatches))
  logits      on the last stage: fp32 log-softmax of one microbatch (S x vocab/TP x 4 B) plus
              the logits themselves in the parameter dtype
  runtime     CUDA context, NCCL buffers, allocator slack (TRAINER_RUNTIME_GIB)

Engine, per GPU: weights / engine TP (all of them, every expert too: vLLM splits each expert's FFN
over the engine's TP ranks) + runtime (ENGINE_RUNTIME_GIB: the profiling peak at vLLM's
max_num_batched_tokens and CUDA graphs) + KV cache, which fills the rest of
gpu_memory_utilization x GPU memory (or is `rollout.kv_cache_bytes` on the CPU build).

Reference (KL to a frozen copy): its weights, params bytes of the same stage, either resident
(counted in every moment) or offloaded to the host between uses (`algorithm.reference=offload`),
then counted only while the reference log-probs run, next to the policy's full training state.

Colocated, the two time-share each GPU: while the engine generates, the trainer keeps only its
params (grads and optimizer offloaded) and a resident reference; while the trainer trains, the
sleeping engine keeps only its runtime. A third moment is the engine's construction: vLLM claims
gpu_memory_utilization x the GPU then, while the trainer steps aside (optimizer state and gradient
buffers offloaded, the reference on the host: loop/placement/timeshare.py `trainer_aside`) but keeps its
params. The peak is the largest of these moments.
"""

from __future__ import annotations

import math

from megatron_rl.parallel.layout import RECOMPUTE_MODES, ParallelLayout
from megatron_rl.plan.inputs import GIB, PlanInputs

# Assumed fixed overheads (GiB per GPU); on the CPU build one process stands in for a GPU.
TRAINER_RUNTIME_GIB = {"gpu": 3.0, "cpu": 1.0}
ENGINE_RUNTIME_GIB = {"gpu": 3.0, "cpu": 0.7}  # CPU: measured engine RSS with a 64 MiB KV cache
GRAD_BYTES = 4
FP32_LOGPROB_BYTES = 4


def optimizer_bytes_per_param(params_dtype: str) -> int:
    """Adam's state per parameter: m and v in fp32, plus an fp32 master copy unless the params are fp32."""
    return 8 if params_dtype == "fp32" else 12


def _runtime(inp: PlanInputs, table: dict) -> float:
    return table["cpu" if inp.hw.is_cpu else "gpu"] * GIB


def stage_layers(inp: PlanInputs, layout: ParallelLayout) -> list[int]:
    """Layers per pipeline stage: the recipe's explicit split, else an even one."""
    return layout.stage_layers(inp.spec.num_layers)


def stage_params(inp: PlanInputs, layout: ParallelLayout) -> list[int]:
    """Parameters of every pipeline stage (whole, before TP): layers, plus the embedding on the first
    and the output layer and final norm on the last. The vocabulary is megatron's, padded to a
    multiple of make_vocab_size_divisible_by x TP; tied embeddings are held twice once PP > 1.
    """
    s = inp.spec
    rows = s.padded_vocab(layout.tp) * s.hidden_size
    split = stage_layers(inp, layout)
    out = []
    for i, layers in enumerate(split):
        n = layers * s.layer_params()
        if i == 0:
            n += rows
        if i == len(split) - 1:
            n += s.hidden_size + (0 if (s.tie_word_embeddings and len(split) == 1) else rows)
        out.append(n)
    return out


def stage_expert_params(inp: PlanInputs, layout: ParallelLayout) -> list[int]:
    """The experts' share of every stage's parameters (0 for a dense model): sharded over EP x ETP,
    not TP, and their optimizer state over expert-DP, not DP (megatron-core's expert grid)."""
    s = inp.spec
    per_layer = s.num_experts * s.expert_params() if s.is_moe else 0
    return [layers * per_layer for layers in stage_layers(inp, layout)]


def stage_params_per_gpu(inp: PlanInputs, layout: ParallelLayout) -> list[tuple[float, float]]:
    """(dense, expert) parameters one trainer GPU holds on every stage: dense / TP, experts / (EP x ETP)."""
    experts = stage_expert_params(inp, layout)
    shard = layout.ep * layout.etp
    return [((n - e) / layout.tp, e / shard) for n, e in zip(stage_params(inp, layout), experts)]


def activation_bytes_per_layer_token(inp: PlanInputs, layout: ParallelLayout, recompute: str) -> float:
    """Bytes one token leaves behind in one layer for backward (see the module docstring)."""
    s, t, cp = inp.spec, layout.tp, layout.cp
    h, q, kv, f = s.hidden_size, s.q_size, s.kv_size, s.ffn_hidden_size
    hidden = 4 * h / t if layout.sequence_parallel else 4 * h
    if s.is_moe:
        # Each of a TP rank's tokens (1/TP of them: MoE needs sequence parallelism at TP > 1) is copied
        # to its top-k experts, and the dispatcher then all-gathers the copies over the expert TP group:
        # ETP copies of the input h, each with its rank's SwiGLU share 3 x moe_ffn / ETP.
        mlp = s.moe_topk * (layout.etp * h + 3 * s.moe_ffn_hidden_size) / t
        selective = (hidden + (2 * q + 2 * kv) / t + mlp) / cp
    else:
        sharded = 2 * q + 2 * kv + 3 * f
        selective = (hidden + sharded / t) / cp
    b = s.dtype_bytes
    if recompute == "selective":
        return selective * b
    if recompute == "none":
        scores = (s.num_attention_heads / t) * inp.work.max_sequence_tokens / cp
        return (selective + scores) * b
    if recompute == "full":
        layer_input = (h / t if layout.sequence_parallel else h) / cp
        return layer_input * b
    raise ValueError(f"recompute={recompute!r} is not one of {RECOMPUTE_MODES}")


def trainer_memory(inp: PlanInputs, layout: ParallelLayout, recompute: str | None = None) -> dict:
    """Bytes per trainer GPU on the heaviest PP stage, by part; `total` is the training-phase peak.

    1F1B keeps min(PP - i, microbatches) microbatches in flight on stage i: the first stage holds the
    most activations, the last one the logits.
    """
    recompute = recompute or layout.recompute
    s, w = inp.spec, inp.work
    tp, pp = layout.tp, layout.pp
    b = s.dtype_bytes
    opt_per_param = optimizer_bytes_per_param(s.params_dtype)
    shard = layout.dp * layout.cp if inp.assume.distributed_optimizer else 1
    expert_shard = layout.expert_dp if inp.assume.distributed_optimizer else 1
    tokens = w.micro_batch_size * w.max_sequence_tokens
    per_mb_layer = activation_bytes_per_layer_token(inp, layout, recompute) * tokens
    # Full recompute: one layer's whole set exists at a time, while it is recomputed for backward.
    working = (
        activation_bytes_per_layer_token(inp, layout, "selective") * tokens if recompute == "full" else 0.0
    )
    microbatches = max(1, math.ceil(w.samples / w.minibatches / layout.dp / w.micro_batch_size))
    has_reference = w.reference_forward
    resident_reference = has_reference and inp.assume.reference == "resident"
    logits = tokens / layout.cp * s.padded_vocab(tp) / tp * (FP32_LOGPROB_BYTES + b)
    runtime = _runtime(inp, TRAINER_RUNTIME_GIB)
    best: dict | None = None
    per_gpu = stage_params_per_gpu(inp, layout)
    for i, (layers, (dense_gpu, expert_gpu)) in enumerate(zip(stage_layers(inp, layout), per_gpu)):
        n_gpu = dense_gpu + expert_gpu
        in_flight = min(pp - i, microbatches)
        optimizer = dense_gpu * opt_per_param / shard
        if expert_gpu:
            optimizer += expert_gpu * opt_per_param / max(1, expert_shard)
        parts = {
            "params": n_gpu * b,
            "grads": n_gpu * GRAD_BYTES,
            "optimizer": optimizer,
            "activations": layers * per_mb_layer * in_flight + working,
            "logits": logits if i == pp - 1 else 0.0,
            "reference": n_gpu * b if resident_reference else 0.0,
            "runtime": runtime,
        }
        parts["total"] = sum(parts.values())
        # Offloaded reference: on the device only for its forward, beside the full training state.
        ref_moment = parts["total"] - parts["activations"] + n_gpu * b if has_reference else 0.0
        parts["reference_logprobs_total"] = 0.0 if resident_reference else ref_moment
        parts["stage"] = i
        parts["in_flight_microbatches"] = in_flight
        if best is None or max(parts["total"], parts["reference_logprobs_total"]) > max(
            best["total"], best["reference_logprobs_total"]
        ):
            best = parts
    assert best is not None
    best["stages"] = pp
    best["recompute"] = recompute
    best["resident_while_generating"] = best["params"] + best["reference"] + runtime
    # Building the engine: optimizer, grads and the reference are aside; params and runtime stay.
    best["resident_at_engine_construction"] = best["params"] + runtime
    return best


def engine_memory(inp: PlanInputs, layout: ParallelLayout) -> dict:
    """Bytes per engine GPU by part, the KV tokens one engine replica holds, and why it may not fit."""
    s = inp.spec
    etp = layout.engine_tp
    weights = inp.weights_bytes / etp
    runtime = _runtime(inp, ENGINE_RUNTIME_GIB)
    budget = inp.assume.gpu_memory_utilization * inp.hw.gpu_memory_bytes
    if inp.assume.kv_cache_bytes > 0:
        kv = float(inp.assume.kv_cache_bytes)
    else:
        kv = max(0.0, budget - weights - runtime)
    # vLLM splits KV heads across TP; past the KV head count each head is replicated.
    kv_per_token_gpu = inp.kv_bytes_per_token / min(etp, s.num_query_groups)
    kv_tokens = int(kv // kv_per_token_gpu)
    reasons = []
    if inp.assume.kv_cache_bytes <= 0 and weights + runtime >= budget:
        reasons.append(
            f"engine weights {weights / GIB:.1f} GiB/GPU at engine TP{etp} + runtime {runtime / GIB:.1f} GiB "
            f"leave no KV cache within gpu_memory_utilization x memory = {budget / GIB:.1f} GiB"
        )
    elif kv_tokens < inp.work.max_sequence_tokens:
        reasons.append(
            f"engine KV cache holds {kv_tokens} tokens per engine, fewer than one longest sequence "
            f"({inp.work.max_sequence_tokens} = prompt cap + completion cap)"
        )
    total = weights + runtime + kv
    return {
        "weights": weights,
        "runtime": runtime,
        "kv_cache": kv,
        "total": total,
        "kv_tokens_per_engine": kv_tokens,
        "kv_bytes_per_token_per_gpu": kv_per_token_gpu,
        "resident_while_training": runtime,
        "reasons": reasons,
    }


def memory_fit(inp: PlanInputs, layout: ParallelLayout, recompute: str | None = None) -> dict:
    """Trainer and engine memory for a layout, the peak per GPU, and every reason it does not fit."""
    tr = trainer_memory(inp, layout, recompute)
    en = engine_memory(inp, layout)
    cap = inp.hw.gpu_memory_bytes
    reasons = list(en["reasons"])
    if layout.colocated:
        generating = en["total"] + tr["resident_while_generating"]
        training = max(tr["total"], tr["reference_logprobs_total"]) + en["resident_while_training"]
        budget = inp.assume.gpu_memory_utilization * cap
        constructing = tr["resident_at_engine_construction"] + budget
        peak = max(generating, training, constructing)
        if constructing > cap:
            reasons.append(
                f"building the engine: vLLM claims gpu_memory_utilization x memory = {budget / GIB:.1f} GiB "
                f"while the trainer keeps its params {tr['resident_at_engine_construction'] / GIB:.1f} GiB "
                f"> {cap / GIB:.0f} GiB per GPU; lower rollout.gpu_memory_utilization or raise layout.tp/pp"
            )
        if training > cap:
            reasons.append(
                f"trainer needs {(training - en['runtime']) / GIB:.1f} GiB/GPU (+{en['runtime'] / GIB:.1f} "
                f"sleeping engine) > {cap / GIB:.0f} GiB with recompute {tr['recompute']}"
                + (
                    f" and a {tr['reference'] / GIB:.1f} GiB resident reference (try algorithm.reference=offload)"
                    if tr["reference"]
                    else ""
                )
            )
        if generating > cap:
            reasons.append(
                f"engine {en['total'] / GIB:.1f} GiB + trainer params (and a resident reference) kept "
                f"resident {tr['resident_while_generating'] / GIB:.1f} GiB > {cap / GIB:.0f} GiB per GPU; "
                "lower rollout.gpu_memory_utilization or set algorithm.reference=offload"
            )
    else:
        peak = max(tr["total"], tr["reference_logprobs_total"], en["total"])
        if tr["total"] > cap:
            reasons.append(
                f"trainer needs {tr['total'] / GIB:.1f} GiB/GPU > {cap / GIB:.0f} GiB "
                f"with recompute {tr['recompute']}"
            )
        if en["total"] > cap:
            reasons.append(f"engine needs {en['total'] / GIB:.1f} GiB/GPU > {cap / GIB:.0f} GiB")
    return {"trainer": tr, "engine": en, "peak": peak, "fits": not reasons, "reasons": reasons}


def _gib(parts: dict) -> dict:
    return {
        k: (v / GIB if isinstance(v, float | int) and not isinstance(v, bool) else v)
        for k, v in parts.items()
    }


def memory_per_gpu(run) -> dict:
    """Memory per GPU of a resolved run's own layout (run/resolve.py), in GiB: cheap and pure, for
    `validate`'s fit check.

    Returns {"trainer": {...parts, "total"}, "engine": {...parts, "total"}, "trainer_per_gpu",
    "engine_per_gpu", "peak_per_gpu", "gpu_memory_gib", "activations_by_recompute", "fits", "reasons"}.
    """
    from megatron_rl.plan.inputs import inputs_from_run

    inp, layout = inputs_from_run(run), run.layout
    fit = memory_fit(inp, layout)
    trainer = _gib({k: v for k, v in fit["trainer"].items()})
    engine = _gib({k: v for k, v in fit["engine"].items() if k != "kv_bytes_per_token_per_gpu"})
    engine["kv_tokens_per_engine"] = fit["engine"]["kv_tokens_per_engine"]
    trainer["in_flight_microbatches"] = fit["trainer"]["in_flight_microbatches"]
    by_mode = {m: trainer_memory(inp, layout, m)["activations"] / GIB for m in RECOMPUTE_MODES}
    return {
        "trainer": trainer,
        "engine": engine,
        "trainer_per_gpu": trainer["total"],
        "engine_per_gpu": engine["total"],
        "peak_per_gpu": fit["peak"] / GIB,
        "gpu_memory_gib": inp.hw.gpu_memory_bytes / GIB,
        "activations_by_recompute": by_mode,
        "fits": fit["fits"],
        "reasons": fit["reasons"],
    }
