"""Generation: decode is bound by memory bandwidth, and the longest completion holds the batch.

Every decode step of an engine replica reads all its weights once (W / engine TP per GPU) and, for
every sequence in the batch, the KV cache of its context (2 x layers x KV heads x head dim x bytes
per token). A replica holding B sequences therefore moves W + B·KV(context) bytes per step, at the
assumed fraction of HBM bandwidth, unless 2·P·B FLOPs per step take longer (the roofline max).

The bulk of a step's completions (mean length c) need N·c / B decode steps per replica. The longest
completion (the cap: with thousands of samples and a heavy tail, one reaches it) needs one step per
token however few sequences are left, so a replica runs max(bulk steps, cap) steps and the tail
steps read the whole weights for a nearly empty batch. That sequential floor, not the bandwidth
work, sets the wall time of generation for long-tailed tasks; it is independent of how many
engines there are. A mixture of experts reads, per step, its dense weights and only the experts
its batch routes to (`PlanInputs.decode_weight_bytes`); its KV cache is attention's, as dense. With engine TP > 1 every decode step also waits on two all-reduces per layer,
whose latency (not bandwidth: the messages are a few KB) adds to each step. "GPU-seconds" of generation here is the work at full batches (prefill + bulk);
"held" GPU-seconds are wall x engine GPUs, and their difference is the GPUs idling in the tail.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.flops import (
    decode_context_sum,
    decode_flops_per_sample,
    prefill_flops,
    prefill_flops_per_prompt,
)
from megatron_rl.plan.inputs import GIB, PlanInputs
from megatron_rl.plan.memory import engine_memory

# Latency of one small all-reduce of a TP engine's decode step (vLLM's custom all-reduce over NVLink;
# its CPU build's shared-memory one): assumed. The trainer's process groups have the cluster's
# `allreduce_latency_us`.
DECODE_ALLREDUCE_LATENCY_S = 8e-6

# vLLM's default max_num_seqs for the offline LLM class: 1024 on GPUs of >= 70 GiB (not A100),
# 256 on smaller ones, 256 x TP on its CPU build (vllm/engine/arg_utils.py).
MAX_NUM_SEQS_LARGE_GPU = 1024
MAX_NUM_SEQS_DEFAULT = 256


def max_num_seqs(inp: PlanInputs, engine_tp: int) -> int:
    if inp.hw.is_cpu:
        return MAX_NUM_SEQS_DEFAULT * engine_tp
    if inp.hw.gpu_memory_bytes >= 70 * GIB:
        return MAX_NUM_SEQS_LARGE_GPU
    return MAX_NUM_SEQS_DEFAULT


@dataclass(frozen=True)
class Generation:
    engines: int
    engine_tp: int
    prompts_per_engine: int
    sequences_per_engine: int
    kv_tokens_per_engine: int
    kv_tokens_per_sequence: float  # mean final context; the prompt counted once per group when shared
    concurrent_sequences: int  # per engine, at the mean context, also capped by max_num_seqs
    concurrent_at_cap: int  # per engine, if every sequence ran to the completion cap
    weights_bytes_per_step: float  # per engine replica
    kv_bytes_per_step: float  # per engine replica, full batch at the mean context
    bytes_per_decode_step: float
    bulk_decode_steps: int
    decode_steps: int
    compute_bound: bool
    step_latency_s: float  # TP all-reduce latency per decode step
    prefill_flops_shared: float  # whole step, all engines
    prefill_flops_unshared: float
    prefill_s: float
    bulk_decode_s: float
    tail_s: float
    decode_s: float
    wall_s: float
    bulk_end_s: float  # when the bulk of the completions has finished (scoring streams from here back)
    longest_completion_floor_s: float
    gpu_seconds: float  # work: prefill + bulk decode, engines x TP
    gpu_seconds_held: float  # engines x TP x wall
    reasons: tuple

    def as_dict(self) -> dict:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d


def generation(inp: PlanInputs, layout: ParallelLayout) -> Generation:
    """Generation phase of one step on `layout`'s engines."""
    w, s, hw = inp.work, inp.spec, inp.hw
    etp, engines = layout.engine_tp, layout.engine_count
    n = w.samples_per_prompt
    if engines <= w.prompts:  # whole prompt groups per engine, so their prefix can be shared
        ppe = math.ceil(w.prompts / engines)
        seqs = ppe * n
    else:
        ppe = 1
        seqs = math.ceil(w.samples / engines)
    mem = engine_memory(inp, layout)
    reasons = list(mem["reasons"])
    kv_tokens = mem["kv_tokens_per_engine"]
    prompt_kv = w.prompt_tokens / n if inp.assume.prefix_sharing else w.prompt_tokens
    per_seq = prompt_kv + w.completion_tokens
    kv_limited = int(kv_tokens // per_seq)
    batch = min(seqs, kv_limited, max_num_seqs(inp, etp))
    at_cap = int(kv_tokens // (prompt_kv + w.max_new_tokens))
    if batch < 1:
        reasons.append(
            f"engine KV cache ({kv_tokens} tokens) cannot hold one sequence of mean length {per_seq:.0f}"
        )
        batch = 1

    # Per GPU of a replica: its weight shard and its share of KV heads (replicated past the KV head count).
    bw = hw.hbm_bytes_per_s * inp.assume.generation_bw_fraction
    w_gpu = inp.weights_bytes / etp
    # A mixture of experts reads only the experts its batch routes to: the bulk at its batch, the
    # longest completion alone its own top-k; the tail (a shrinking handful of sequences, each
    # routing to other experts) is charged the whole weights, as for a dense model.
    bulk_w_gpu = inp.decode_weight_bytes(batch) / etp
    floor_w_gpu = inp.decode_weight_bytes(1) / etp
    kv_gpu = mem["kv_bytes_per_token_per_gpu"]
    compute = etp * hw.peak_flops * inp.assume.train_mfu  # per replica
    p, c, cap = w.prompt_tokens, w.completion_tokens, w.max_new_tokens
    step_latency = 2 * s.num_layers * DECODE_ALLREDUCE_LATENCY_S if etp > 1 else 0.0

    bulk_steps = math.ceil(seqs * c / batch)
    bulk_bytes_gpu = bulk_steps * bulk_w_gpu + seqs * kv_gpu * decode_context_sum(p, c)
    bulk_flops = seqs * decode_flops_per_sample(inp, c)
    bulk_bw_s = bulk_bytes_gpu / bw
    bulk_compute_s = bulk_flops / compute
    bulk_s = max(bulk_bw_s, bulk_compute_s) + bulk_steps * step_latency
    tail_steps = max(0, cap - bulk_steps)
    tail_kv = decode_context_sum(p, cap) - decode_context_sum(p, min(bulk_steps, cap))
    tail_s = (tail_steps * w_gpu + kv_gpu * tail_kv) / bw + tail_steps * step_latency
    floor_s = (cap * floor_w_gpu + kv_gpu * decode_context_sum(p, cap)) / bw + cap * step_latency
    decode_s = max(bulk_s + tail_s, floor_s)

    shared = prefill_flops(inp, shared=True)
    unshared = prefill_flops(inp, shared=False)
    per_engine_prefills = ppe if inp.assume.prefix_sharing else seqs
    prefill_s = per_engine_prefills * prefill_flops_per_prompt(inp) / compute
    wall = prefill_s + decode_s
    gpus = engines * etp
    mean_ctx = p + (c - 1) / 2
    return Generation(
        engines=engines,
        engine_tp=etp,
        prompts_per_engine=ppe,
        sequences_per_engine=seqs,
        kv_tokens_per_engine=kv_tokens,
        kv_tokens_per_sequence=per_seq,
        concurrent_sequences=batch,
        concurrent_at_cap=at_cap,
        weights_bytes_per_step=inp.decode_weight_bytes(batch),
        kv_bytes_per_step=batch * inp.kv_bytes_per_token * mean_ctx,
        bytes_per_decode_step=inp.decode_weight_bytes(batch) + batch * inp.kv_bytes_per_token * mean_ctx,
        bulk_decode_steps=bulk_steps,
        decode_steps=max(bulk_steps, cap),
        compute_bound=bulk_compute_s > bulk_bw_s,
        step_latency_s=step_latency,
        prefill_flops_shared=shared,
        prefill_flops_unshared=unshared,
        prefill_s=prefill_s,
        bulk_decode_s=bulk_s,
        tail_s=tail_s,
        decode_s=decode_s,
        wall_s=wall,
        bulk_end_s=prefill_s + bulk_s,
        longest_completion_floor_s=floor_s,
        gpu_seconds=gpus * (prefill_s + bulk_s),
        gpu_seconds_held=gpus * wall,
        reasons=tuple(reasons),
    )
