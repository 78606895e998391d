"""The hand case: a model small enough to count by hand (the reference recipe is a fixture).

The hand model (2 layers, hidden 4, 2 heads of dim 2, 1 KV head, FFN 8, vocab 10, bf16):
    q_size = 2 x 2 = 4, kv_size = 1 x 2 = 2
    per layer: QKV 4 x (4 + 2 x 2) = 32, proj 4 x 4 = 16, SwiGLU 3 x 4 x 8 = 96, norms 2 x 4 = 8 -> 152
    all params: 2 x 152 + embedding 40 + output 40 + final norm 4 = 388 -> weights 776 B in bf16
    matmul params: 2 x 152 + output 40 = 344
    KV bytes per token: 2 (K, V) x 2 layers x 1 KV head x 2 head dim x 2 B = 16
Workload: 2 prompts x 2 samples, prompt 1 token, completions 2 tokens on average, cap 4.
HBM 1,552 B/s at a 0.5 fraction -> 776 B/s: reading the weights once takes exactly 1 s.
"""

from __future__ import annotations

import dataclasses

from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import (
    GIB,
    Assumptions,
    Hardware,
    PlanInputs,
    Workload,
)
from megatron_rl.plan.search import CANDIDATE  # the layouts the search starts from

REFERENCE = "grpo_qwen2.5-32b_32n8g"


def hand_inputs(work: dict | None = None, hw: dict | None = None, assume: dict | None = None) -> PlanInputs:
    spec = ModelSpec(
        name="hand",
        family="llama",
        num_layers=2,
        hidden_size=4,
        ffn_hidden_size=8,
        num_attention_heads=2,
        num_query_groups=1,
        head_dim=2,
        vocab_size=10,
        make_vocab_size_divisible_by=1,
        max_position_embeddings=64,
        rope_theta=1e4,
        norm_eps=1e-6,
        qkv_bias=False,
        qk_norm=False,
        tie_word_embeddings=False,
        params_dtype="bf16",
    )
    w = Workload(
        prompts=2,
        samples_per_prompt=2,
        prompt_tokens=1,
        max_prompt_tokens=2,
        completion_tokens=2,
        max_new_tokens=4,
        minibatches=1,
        micro_batch_size=1,
        reference_forward=True,
        old_forward=True,
        seconds_per_sample=1.0,
        pool_cores=2,
        steps=10,
    )
    h = Hardware(
        nodes=1,
        gpus_per_node=2,
        gpu_memory_bytes=10 * GIB,
        hbm_bytes_per_s=1552.0,
        peak_flops=1e15,
        nvlink_bytes_per_s=100.0,
        node_ib_bytes_per_s=10.0,
        storage_bytes_per_s=7.0,
        node_mtbf_s=1000.0,
        is_cpu=True,
    )
    a = Assumptions(
        train_mfu=0.5,
        generation_bw_fraction=0.5,
        prefix_sharing=False,
        gpu_memory_utilization=0.5,
        kv_cache_bytes=1600,  # 100 tokens of 16 B
        sleep_level=1,
        distributed_optimizer=True,
        publish_pack_s=0.0,
        publish_install_s=0.0,
        publish_validate_s=0.0,
        target_hours=1.0,
        checkpoint_interval_steps=-1,  # Young/Daly
        async_save=False,
    )
    return PlanInputs(
        name="hand",
        spec=spec,
        work=dataclasses.replace(w, **(work or {})),
        hw=dataclasses.replace(h, **(hw or {})),
        assume=dataclasses.replace(a, **(assume or {})),
    )


HAND_LAYOUT = ParallelLayout(
    tp=1,
    pp=1,
    dp=1,
    engine_tp=1,
    engine_count=1,
    **CANDIDATE,
)
