"""Rollout engine benchmark: start time, publication time, tokens/s (cold and warm). Prints JSON.

    OMP_NUM_THREADS=1 python benchmarks/rollout.py [--prompts 16] [--samples 4] [--tokens 32] [--iters 3]

One in-process vLLM engine (the CPU build here, the GPU build where CUDA is present) on the tiny
Qwen2 of the CPU recipe (head_dim 64), started from config.json alone, then given random fp32
weights through `update_weights`. The first generation pays one-off kernel set-up; the warm figure
is the median of the following iterations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from megatron_rl.config.schema import RolloutConfig
from megatron_rl.loop.placement.timeshare import memory_snapshot
from megatron_rl.models.tiny import hf_config, hf_model, tiny_spec
from megatron_rl.rollout.types import SamplingSettings
from megatron_rl.rollout.vllm_engine import VLLMEngine

SPEC = tiny_spec(name="bench_tiny", vocab_size=256, make_vocab_size_divisible_by=64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    cfg = RolloutConfig(kv_cache_bytes=64 << 20, enforce_eager=True)
    with tempfile.TemporaryDirectory() as d:
        hf_config(SPEC).save_pretrained(d)
        engine = VLLMEngine(cfg, d, tp=1, seed=0)
        state = hf_model(SPEC, seed=0).state_dict()
        t = time.perf_counter()
        engine.update_weights(state.items(), version=1)
        publish_s = time.perf_counter() - t
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(0, SPEC.vocab_size, (args.prompt_len,), generator=g).tolist()
            for _ in range(args.prompts)
        ]
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=args.tokens)
        runs = []
        for _ in range(1 + args.iters):
            engine.generate(prompts, args.samples, sampling)
            runs.append(engine.last_stream)
        print(
            json.dumps(
                dict(
                    device="cuda" if engine.on_gpu else "cpu",
                    threads=torch.get_num_threads(),
                    engine_start_s=round(engine.start_s, 3),
                    publish_s=round(publish_s, 4),
                    batch=dict(prompts=args.prompts, samples=args.samples, tokens=args.tokens),
                    cold_tokens_per_s=round(runs[0]["tokens_per_s"], 1),
                    warm_tokens_per_s=round(statistics.median(r["tokens_per_s"] for r in runs[1:]), 1),
                    memory=memory_snapshot(),
                )
            )
        )


if __name__ == "__main__":
    main()
