"""GPU checks of the trainer, for a machine with CUDA (one GPU is enough). Prints JSON.

    pip install megatron-core==0.16.1   # if the machine's PyTorch lacks it
    python tools/gpu_check.py [--out gpu.json] [--skip-mfu]

1. Log-prob agreement: the trainer built at TP1 from a random HF checkpoint, with the CPU patches
   *not* applied (CUDA present), against HF transformers on the same weights -- fp32 (expected
   <= 1e-5, like the CPU tests) and bf16 (stated separately: bf16 rounding gives ~1e-2).
2. MFU: forward+backward of a ~1B-parameter config in bf16, timed; MFU = 6 * params * tokens / time /
   peak (the planner assumes 40% of the recipe's peak; --peak-tflops sets the GPU's dense bf16 peak).
3. The loop's trainer half on a ~1B config: old and reference log-probs and one minibatch update,
   each timed with the telemetry's phase timer (GPU allocated/reserved, peak reset per phase).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_rl.models.tiny import tiny_spec  # noqa: E402

TINY = tiny_spec(
    name="gpu_check_tiny", vocab_size=1000, make_vocab_size_divisible_by=128, max_position_embeddings=512
)
ONE_B = replace(
    TINY,
    name="llama_1b",
    family="llama",
    num_layers=16,
    hidden_size=2048,
    ffn_hidden_size=8192,
    num_attention_heads=32,
    num_query_groups=8,
    head_dim=64,
    vocab_size=128256,
    qkv_bias=False,
    max_position_embeddings=4096,
    params_dtype="bf16",
)


def _init():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29591")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    from megatron_rl.trainer.parallel import init_parallel

    return init_parallel(1, 1)


def logprob_agreement(state, tmp: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from megatron_rl.models.megatron import ParallelSizes
    from megatron_rl.models.tiny import write_hf_checkpoint
    from megatron_rl.trainer.hf_import import load_hf_into
    from megatron_rl.trainer.policy import Policy

    ckpt = write_hf_checkpoint(TINY, tmp / "tiny")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, TINY.vocab_size, (n,), generator=g).tolist() for n in (33, 57, 12, 40)]
    plens = [5, 9, 3, 20]
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ref = []
    for s, p in zip(seqs, plens):
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([s])).logits[0].float(), -1)
        ref.append(lp[torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:])])
    out = {}
    for dtype in ("fp32", "bf16"):
        pol = Policy(TINY, state, ParallelSizes(1, 1), dtype=dtype)
        load_hf_into(pol.model, TINY, ckpt, 1, 0, pol.padded_vocab)
        got = pol.logprobs(seqs, plens)
        out[dtype] = max((a.cpu() - b).abs().max().item() for a, b in zip(got, ref))
    return {
        "max_abs_diff_vs_hf": out,
        "cpu_patches_applied": __import__("megatron_rl.trainer.cpu_compat", fromlist=["x"]).applied_patches(),
    }


def mfu(state, peak_tflops: float, seq_len: int = 2048, micro_batch: int = 4, iters: int = 5) -> dict:
    from megatron_rl.models.megatron import ParallelSizes
    from megatron_rl.trainer.policy import OptimSettings, Policy

    pol = Policy(
        ONE_B,
        state,
        ParallelSizes(1, 1, recompute="none"),
        optim=OptimSettings(lr=1e-5),
        micro_batch_size=micro_batch,
    )
    params = sum(p.numel() for p in pol.model.parameters())
    seqs = [torch.randint(0, ONE_B.vocab_size, (seq_len,)).tolist() for _ in range(micro_batch * 2)]
    plens = [1] * len(seqs)
    tokens = sum(len(s) for s in seqs)

    def loss(lp, mb):
        return -(lp * mb.loss_mask_BT.to(lp.device)).sum() / tokens, {}

    pol.train_step(seqs, plens, loss)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        pol.train_step(seqs, plens, loss)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / iters
    achieved = 6 * params * tokens / dt / 1e12
    return {
        "params": params,
        "tokens_per_step": tokens,
        "seconds_per_step": dt,
        "tflops": achieved,
        "peak_tflops": peak_tflops,
        "mfu": achieved / peak_tflops,
    }


def loop_phases(state) -> dict:
    from megatron_rl.models.megatron import ParallelSizes
    from megatron_rl.telemetry.phases import PhaseTimer
    from megatron_rl.trainer.policy import OptimSettings, Policy

    timer = PhaseTimer()
    with timer.phase("init"):
        pol = Policy(
            ONE_B,
            state,
            ParallelSizes(1, 1, recompute="full"),
            optim=OptimSettings(lr=1e-6),
            micro_batch_size=4,
        )
        ref = Policy(ONE_B, state, ParallelSizes(1, 1), micro_batch_size=4)
    seqs = [torch.randint(0, ONE_B.vocab_size, (1024 + 64 * i,)).tolist() for i in range(16)]
    plens = [256] * len(seqs)
    with timer.phase("old_logprobs"):
        old = pol.logprobs(seqs, plens)
    with timer.phase("ref_logprobs"):
        ref.logprobs(seqs, plens)
    tokens = float(sum(len(s) - p for s, p in zip(seqs, plens)))
    extras = {"old": [o.cpu() for o in old]}

    def loss(lp, mb):
        from megatron_rl.algorithms import grpo_loss

        dev = lp.device
        adv = torch.ones(lp.shape[0], device=dev)
        return grpo_loss(lp, mb.extras["old"].to(dev), adv, mb.loss_mask_BT.to(dev), global_tokens=tokens)

    pol.train_step(seqs, plens, loss, extras=extras, timer=timer)
    return {
        k: {"seconds": v.seconds, "allocated_gib": v.mem_gib, "reserved_gib": v.reserved_gib}
        for k, v in timer.take().items()
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="gpu_check.json")
    p.add_argument(
        "--peak-tflops", type=float, default=989.0, help="dense bf16 peak of this GPU (H100 SXM: 989)"
    )
    p.add_argument("--skip-mfu", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    state = _init()
    report = {"device": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory() as tmp:
        report["logprobs"] = logprob_agreement(state, Path(tmp))
    if not args.skip_mfu:
        report["mfu"] = mfu(state, args.peak_tflops)
        report["loop_phases"] = loop_phases(state)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
