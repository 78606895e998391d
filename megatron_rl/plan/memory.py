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

PPO adds two models on the trainer's GPUs, each counted by its own shape (plan/models.py), at the
trainer's layout (stage i of every model on the same GPU):
  critic        trained like the policy: params, grads and optimizer at the same bytes per parameter
                (18 with bf16: 2 + 4 for megatron's fp32 main grads + 12, the 12 divided by DP x CP
                with the distributed optimizer; the often quoted 16 assumes bf16 grads),
                activations at critic.recompute ("" = the layout's) and critic.micro_batch_size (0 =
                optim's), and its values (fp32 + the dtype, one per token) instead of logits. As the loop
                runs it (loop/placement/timeshare.py: the critic's optimizer and DDP go aside with the
                policy's), its grads and optimizer state are on the host while the engines generate and
                are built, and its weights stay on the device, as the policy's do; its whole training
                state is on the device while the step trains (the policy's and the critic's optimizer
                steps alternate per minibatch). Their backward activations never coexist (one model's
                forward and backward at a time), so the training moment holds the larger working set
                (activations + logits or values) of the two.
  reward model  frozen, weights only (the dtype's bytes per parameter of its stage), on the host
                between uses: on the device for its forward after generation, beside the policy's and
                the critic's training state (assumed resident then, the conservative case) and one
                layer's working set of one microbatch; its output is one score per sequence.
The reference's and the reward model's forwards are moments of their own; an offloaded reference's
forward also has the critic's training state beside it. `by_model` gives each model's share of the GPU,
with its parameters on that GPU and the bytes per parameter they cost, so that a trained model's params +
grads + optimizer can be checked as parameters x (2 + 4 + 12 / (DP x CP)) with bf16.
"""

from __future__ import annotations

import math

from megatron_rl.parallel.layout import RECOMPUTE_MODES, ParallelLayout
from megatron_rl.plan.inputs import GIB, PlanInputs
from megatron_rl.plan.models import (
    LM,
    SCORE,
    VALUE,
    critic_layout,
    critic_recompute,
    critic_view,
    reward_view,
    stage_params_of,
    stage_split,
)

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
    return stage_split(inp.spec, layout)


def stage_params(inp: PlanInputs, layout: ParallelLayout, head: str = LM) -> list[int]:
    """Parameters of every pipeline stage (whole, before TP): layers, plus the embedding on the first
    and the output layer (`head`: plan/models.py) and final norm on the last. The vocabulary is
    megatron's, padded to a multiple of make_vocab_size_divisible_by x TP; tied embeddings are held
    twice once PP > 1.
    """
    return stage_params_of(inp.spec, layout, head)


def stage_expert_params(inp: PlanInputs, layout: ParallelLayout) -> list[int]:
    """The experts' share of every stage's parameters (0 for a dense model): sharded over EP x ETP,
    not TP, and their optimizer state over expert-DP, not DP (megatron-core's expert grid)."""
    s = inp.spec
    per_layer = s.num_experts * s.expert_params() if s.is_moe else 0
    return [layers * per_layer for layers in stage_layers(inp, layout)]


def stage_params_per_gpu(
    inp: PlanInputs, layout: ParallelLayout, head: str = LM
) -> list[tuple[float, float]]:
    """(dense, expert) parameters one trainer GPU holds on every stage: dense / TP, experts / (EP x ETP)."""
    experts = stage_expert_params(inp, layout)
    shard = layout.ep * layout.etp
    return [((n - e) / layout.tp, e / shard) for n, e in zip(stage_params(inp, layout, head), experts)]


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


def _trained_stages(inp: PlanInputs, layout: ParallelLayout, recompute: str, head: str) -> list[dict]:
    """A trained model's bytes per GPU on every PP stage: its parameters there (a count), params, grads,
    optimizer, the activations of the microbatches 1F1B keeps in flight, and its output (fp32 log-softmax
    + logits of one microbatch for an lm head, one value per token for a value head) on the last stage."""
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
    if head == LM:
        output = tokens / layout.cp * s.padded_vocab(tp) / tp * (FP32_LOGPROB_BYTES + b)
    else:
        output = tokens / layout.cp * (FP32_LOGPROB_BYTES + b)
    out = []
    per_gpu = stage_params_per_gpu(inp, layout, head)
    for i, (layers, (dense_gpu, expert_gpu)) in enumerate(zip(stage_layers(inp, layout), per_gpu)):
        n_gpu = dense_gpu + expert_gpu
        in_flight = min(pp - i, microbatches)
        optimizer = dense_gpu * opt_per_param / shard
        if expert_gpu:
            optimizer += expert_gpu * opt_per_param / max(1, expert_shard)
        out.append(
            {
                "parameters": n_gpu,
                "params": n_gpu * b,
                "grads": n_gpu * GRAD_BYTES,
                "optimizer": optimizer,
                "activations": layers * per_mb_layer * in_flight + working,
                "output": output if i == pp - 1 else 0.0,
                "in_flight": in_flight,
                "optimizer_shards": shard,
            }
        )
    return out


def _frozen_stages(inp: PlanInputs, layout: ParallelLayout, head: str) -> list[dict]:
    """A frozen model's bytes per GPU on every PP stage: its weights, and the working set of its forward
    (one layer's selective set for one microbatch of the longest sequence, and one fp32 score per token)."""
    s, w = inp.spec, inp.work
    tokens = w.micro_batch_size * w.max_sequence_tokens
    working = activation_bytes_per_layer_token(inp, layout, "selective") * tokens
    working += tokens / layout.cp * (FP32_LOGPROB_BYTES + s.dtype_bytes)
    return [
        {"parameters": dense + expert, "params": (dense + expert) * s.dtype_bytes, "activations": working}
        for dense, expert in stage_params_per_gpu(inp, layout, head)
    ]


def trainer_memory(inp: PlanInputs, layout: ParallelLayout, recompute: str | None = None) -> dict:
    """Bytes per trainer GPU on the heaviest PP stage, by part; `total` is the training-phase peak.

    1F1B keeps min(PP - i, microbatches) microbatches in flight on stage i: the first stage holds the
    most activations, the last one the logits. With PPO, `critic` is the critic's training state and
    `critic_activations` its working set (activations + values): the training moment (`total`) adds the
    state and what the critic's working set exceeds the policy's; `reward_model_forward_total` is the
    reward model's forward moment (0 without one). `by_model` is each model's share (module docstring).
    """
    recompute = recompute or layout.recompute
    s, w = inp.spec, inp.work
    b = s.dtype_bytes
    has_reference = w.reference_forward
    resident_reference = has_reference and inp.assume.reference == "resident"
    runtime = _runtime(inp, TRAINER_RUNTIME_GIB)
    policy = _trained_stages(inp, layout, recompute, LM)
    critic_rec = critic_recompute(inp, recompute)
    critic = _critic_stages(inp, layout, critic_rec) if inp.critic else None
    reward = _frozen_stages(reward_view(inp), layout, SCORE) if inp.reward_model else None
    best: dict | None = None
    for i, pol in enumerate(policy):
        n_gpu = pol["parameters"]
        parts = {
            "params": pol["params"],
            "grads": pol["grads"],
            "optimizer": pol["optimizer"],
            "activations": pol["activations"],
            "logits": pol["output"],
            "reference": n_gpu * b if resident_reference else 0.0,
            "runtime": runtime,
        }
        parts["total"] = sum(parts.values())
        # Offloaded reference: on the device only for its forward, beside the full training state.
        ref_moment = parts["total"] - parts["activations"] + n_gpu * b if has_reference else 0.0
        parts["reference_logprobs_total"] = 0.0 if resident_reference else ref_moment
        parts["stage"] = i
        parts["in_flight_microbatches"] = pol["in_flight"]
        if critic is not None or reward is not None:
            _add_side_models(parts, critic[i] if critic else None, reward[i] if reward else None)
        if best is None or _worst(parts) > _worst(best):
            best = parts
    assert best is not None
    i = best["stage"]
    best["stages"] = layout.pp
    best["recompute"] = recompute
    best["resident_while_generating"] = best["params"] + best["reference"] + runtime
    # Building the engine: optimizer, grads and the reference are aside; params and runtime stay.
    best["resident_at_engine_construction"] = best["params"] + runtime
    if critic is not None:  # the critic's weights stay on the device too (its grads and optimizer go aside)
        best["resident_while_generating"] += critic[i]["params"]
        best["resident_at_engine_construction"] += critic[i]["params"]
    best["by_model"] = _by_model(
        inp,
        policy[i],
        critic[i] if critic else None,
        reward[i] if reward else None,
        (recompute, critic_rec),
    )
    return best


def _worst(parts: dict) -> float:
    """The largest trainer moment of a stage (training, the reference's forward, the reward model's)."""
    worst = max(parts["total"], parts["reference_logprobs_total"])
    return max(worst, parts["reward_model_forward_total"]) if "reward_model_forward_total" in parts else worst


def _critic_stages(inp: PlanInputs, layout: ParallelLayout, recompute: str) -> list[dict]:
    """The critic's bytes per GPU beside each of the policy's stages: stage i's at the trainer's layout; at its
    own layout (critic.tp, critic.pp) every part at its largest over its stages beside every one of them, since
    its stages do not sit on the policy's."""
    own = critic_layout(inp, layout).with_(recompute=recompute)
    stages = _trained_stages(critic_view(inp), own, recompute, VALUE)
    if own.pp == layout.pp and own.tp == layout.tp:
        return stages
    # each part at its largest over the critic's stages (the moments add the parts separately)
    worst = {k: max(m[k] for m in stages) for k in stages[0]}
    return [worst] * layout.pp


def _add_side_models(parts: dict, critic: dict | None, reward: dict | None) -> None:
    """Add PPO's critic and a reward model to one stage's moments (module docstring)."""
    state = critic["params"] + critic["grads"] + critic["optimizer"] if critic else 0.0
    working = critic["activations"] + critic["output"] if critic else 0.0
    # The training state of the policy (and a resident reference) without its working set.
    held = parts["total"] - parts["activations"] - parts["logits"]
    parts["critic"] = state
    parts["critic_activations"] = working
    parts["total"] += state + max(0.0, working - (parts["activations"] + parts["logits"]))
    if parts["reference_logprobs_total"]:
        parts["reference_logprobs_total"] += state
    rm = reward["params"] + reward["activations"] if reward else 0.0
    parts["reward_model_forward_total"] = held + state + rm if reward else 0.0


def _by_model(inp: PlanInputs, policy: dict, critic: dict | None, reward: dict | None, rec: tuple) -> dict:
    """Each model's bytes on one GPU of the chosen stage, with its parameters there and what they cost."""
    w, b = inp.work, inp.spec.dtype_bytes

    def trained(m: dict, output: str, recompute: str, micro_batch: int, on_device: str) -> dict:
        state = m["params"] + m["grads"] + m["optimizer"]
        return {
            "parameters": m["parameters"],
            "params": m["params"],
            "grads": m["grads"],
            "optimizer": m["optimizer"],
            "state": state,
            "bytes_per_param": state / m["parameters"] if m["parameters"] else 0.0,
            "optimizer_shards": m["optimizer_shards"],
            "activations": m["activations"],
            output: m["output"],
            "recompute": recompute,
            "micro_batch_size": micro_batch,
            "on_device": on_device,
        }

    out = {
        "policy": trained(
            policy,
            "logits",
            rec[0],
            w.micro_batch_size,
            "params always; grads and optimizer while the trainer works",
        )
    }
    if critic is not None:
        assert inp.critic is not None
        out["critic"] = trained(
            critic,
            "values",
            rec[1],
            inp.critic.micro_batch_size,
            "params always; grads and optimizer while the trainer works",
        )
    if w.reference_forward:
        resident = inp.assume.reference == "resident"
        out["reference"] = {
            "parameters": policy["parameters"],
            "params": policy["parameters"] * b,
            "bytes_per_param": float(b),
            "on_device": "always (algorithm.reference=resident)"
            if resident
            else "for its forward (algorithm.reference=offload)",
        }
    if reward is not None:
        assert inp.reward_model is not None
        out["reward_model"] = {
            "parameters": reward["parameters"],
            "params": reward["params"],
            "bytes_per_param": float(inp.reward_model.dtype_bytes),
            "activations": reward["activations"],
            "on_device": "for its forward after generation; on the host between uses",
        }
    return out


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
    """Trainer and engine memory for a layout, the peak per GPU, and every reason it does not fit.

    `moments` are the per-GPU totals of each moment the GPU goes through (module docstring); `by_model`
    the share of each model (policy, critic, reference, reward model) on the trainer's heaviest stage.
    """
    tr = trainer_memory(inp, layout, recompute)
    en = engine_memory(inp, layout)
    cap = inp.hw.gpu_memory_bytes
    reasons = list(en["reasons"])
    rm_moment = tr.get("reward_model_forward_total", 0.0)
    ref_moment = tr["reference_logprobs_total"]
    both = " (the policy's and the critic's)" if tr.get("critic") else ""
    if layout.colocated:
        sleeping = en["resident_while_training"]
        generating = en["total"] + tr["resident_while_generating"]
        training = max(tr["total"], ref_moment) + sleeping
        budget = inp.assume.gpu_memory_utilization * cap
        constructing = tr["resident_at_engine_construction"] + budget
        peak = max(generating, training, constructing)
        if rm_moment:
            peak = max(peak, rm_moment + sleeping)
        if constructing > cap:
            reasons.append(
                f"building the engine: vLLM claims gpu_memory_utilization x memory = {budget / GIB:.1f} GiB "
                f"while the trainer keeps its params{both} {tr['resident_at_engine_construction'] / GIB:.1f} GiB "
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
                + _critic_clause(tr, training, cap)
            )
        if generating > cap:
            reasons.append(
                f"engine {en['total'] / GIB:.1f} GiB + trainer params{both} (and a resident reference) kept "
                f"resident {tr['resident_while_generating'] / GIB:.1f} GiB > {cap / GIB:.0f} GiB per GPU; "
                "lower rollout.gpu_memory_utilization or set algorithm.reference=offload"
            )
        moments = {"generating": generating, "training": tr["total"] + sleeping, "constructing": constructing}
    else:
        sleeping = 0.0
        peak = max(tr["total"], ref_moment, en["total"])
        if rm_moment:
            peak = max(peak, rm_moment)
        if tr["total"] > cap:
            reasons.append(
                f"trainer needs {tr['total'] / GIB:.1f} GiB/GPU > {cap / GIB:.0f} GiB "
                f"with recompute {tr['recompute']}" + _critic_clause(tr, tr["total"], cap)
            )
        if en["total"] > cap:
            reasons.append(f"engine needs {en['total'] / GIB:.1f} GiB/GPU > {cap / GIB:.0f} GiB")
        moments = {"generating": en["total"], "training": tr["total"]}
    if ref_moment:
        moments["reference_forward"] = ref_moment + sleeping
    if rm_moment:
        moments["reward_model_forward"] = rm_moment + sleeping
        if rm_moment + sleeping > cap:
            rm = tr["by_model"]["reward_model"]
            beside = " and the critic's" if tr.get("critic") else ""
            reasons.append(
                f"the reward model's forward (reward.model_checkpoint) needs {rm_moment / GIB:.1f} GiB/GPU"
                + (f" (+{sleeping / GIB:.1f} sleeping engine)" if sleeping else "")
                + f" > {cap / GIB:.0f} GiB: its weights {rm['params'] / GIB:.1f} GiB/GPU beside the policy's"
                f"{beside} training state; raise layout.tp/pp"
            )
    return {
        "trainer": tr,
        "engine": en,
        "peak": peak,
        "fits": not reasons,
        "reasons": reasons,
        "moments": moments,
        "by_model": tr["by_model"],
    }


def _critic_clause(tr: dict, needed: float, cap: float) -> str:
    """What PPO's critic adds to a training moment that does not fit, and the keys that change it."""
    if not tr.get("critic"):
        return ""
    c = tr["by_model"]["critic"]
    excess = 0.0
    if tr["total"] >= tr["reference_logprobs_total"]:  # the training moment, not the reference's forward
        excess = max(0.0, tr["critic_activations"] - (tr["activations"] + tr["logits"]))
    share = tr["critic"] + excess
    alone = "; without the critic it would fit" if needed - share <= cap else ""
    if excess:
        fix = "set critic.recompute=full or critic.micro_batch_size=1"
    else:
        fix = "set layout.recompute=full (the policy's activations are the larger working set)"
    return (
        f"; the critic (algorithm.name=ppo, trained on the trainer's GPUs) takes {share / GIB:.1f} GiB of it: "
        f"training state {tr['critic'] / GIB:.1f} GiB ({c['bytes_per_param']:.3g} B/param) + "
        f"{excess / GIB:.1f} GiB of activations beyond the policy's (critic.recompute={c['recompute']}, "
        f"critic.micro_batch_size={c['micro_batch_size']}){alone}; raise critic.tp/pp (0: layout.tp/pp, the "
        f"trainer's) or {fix}"
    )


def _gib(parts: dict) -> dict:
    return {
        k: (v / GIB if isinstance(v, float | int) and not isinstance(v, bool) else v)
        for k, v in parts.items()
    }


# The parts of a `by_model` entry that are bytes (the rest are counts, ratios and words).
MODEL_BYTES = ("params", "grads", "optimizer", "state", "activations", "logits", "values")


def by_model_gib(by_model: dict) -> dict:
    """`by_model` (bytes) with its byte parts in GiB; parameters stay a count, bytes_per_param a ratio."""
    return {
        role: {k: (v / GIB if k in MODEL_BYTES else v) for k, v in parts.items()}
        for role, parts in by_model.items()
    }


def memory_per_gpu(run) -> dict:
    """Memory per GPU of a resolved run's own layout (run/resolve.py), in GiB: cheap and pure, for
    `validate`'s fit check.

    Returns {"trainer": {...parts, "total"}, "engine": {...parts, "total"}, "trainer_per_gpu",
    "engine_per_gpu", "peak_per_gpu", "gpu_memory_gib", "activations_by_recompute", "fits", "reasons",
    "by_model", "moments", "assumed"}: `trainer_per_gpu` is the training moment (with PPO the policy's
    and the critic's training state), `by_model` each model's share of a trainer GPU (parameters there
    as a count), `moments` every moment's total and `assumed` the keys whose shape was the policy's.
    """
    from megatron_rl.plan.inputs import inputs_from_run

    inp, layout = inputs_from_run(run), run.layout
    fit = memory_fit(inp, layout)
    trainer = _gib({k: v for k, v in fit["trainer"].items() if k != "by_model"})
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
        "by_model": by_model_gib(fit["by_model"]),
        "moments": {k: v / GIB for k, v in fit["moments"].items()},
        "assumed": inp.assumed,
    }
