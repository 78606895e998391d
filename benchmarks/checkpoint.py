"""Checkpoint save time and size: the tiny recipe's model and a ~100M-parameter config, at TP2.

    torchrun --nproc-per-node 2 benchmarks/checkpoint.py [--out DIR]

For each model: one optimizer step (so the Adam state exists), then a synchronous save and an
asynchronous one (time until training may continue, and time until the COMPLETE marker), the bytes on
disk, and a load back at the same layout. Prints one JSON object (rank 0).
"""

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _Run:  # the two fields Checkpointer uses
    def __init__(self, rank: int):
        self.rank, self.is_main = rank, rank == 0


def bench(spec, state, root: Path) -> dict:
    from megatron_rl.checkpoint.resume import load
    from megatron_rl.checkpoint.save import Checkpointer
    from megatron_rl.checkpoint.store import is_complete
    from megatron_rl.models.megatron import ParallelSizes
    from megatron_rl.trainer.policy import OptimSettings, Policy

    pol = Policy(spec, state, ParallelSizes(state.tp, 1), optim=OptimSettings(lr=1e-4), micro_batch_size=2)
    seqs = [torch.randint(0, spec.vocab_size, (64,)).tolist() for _ in range(4)]
    pol.train_step(seqs, [8] * 4, lambda lp, mb: (-(lp * mb.loss_mask_BT).sum() / 224.0, {}))
    run = _Run(dist.get_rank())
    out = {"params": spec.num_params(spec.padded_vocab(state.tp))}
    for mode in ("sync", "async"):
        ck = Checkpointer(root / mode, run, keep_last=1, async_save=mode == "async")
        dist.barrier()
        t0 = time.perf_counter()
        path = ck.save(1, pol, None, {"step": 1, "world_size": dist.get_world_size(), "task": {}})
        blocking = time.perf_counter() - t0
        ck.close()
        dist.barrier()
        out[mode] = {
            "blocking_s": round(blocking, 3),
            "complete_s": round(time.perf_counter() - t0, 3),
            "complete": is_complete(path),
        }
    out["bytes"] = dir_bytes(root / "sync" / "step_000001")
    t0 = time.perf_counter()

    class _Task:
        def load_state(self, s):
            pass

    load(root / "sync" / "step_000001", run, pol, None, _Task())
    out["load_s"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from megatron_rl.config.load import load_recipe
    from megatron_rl.models.spec import ModelSpec
    from megatron_rl.trainer.parallel import init_parallel

    state = init_parallel(2, 1)
    tiny = ModelSpec.from_config(load_recipe("grpo_tiny_cpu").model)
    m100 = replace(
        tiny,
        name="llama_100m",
        family="llama",
        num_layers=12,
        hidden_size=768,
        ffn_hidden_size=2048,
        num_attention_heads=12,
        num_query_groups=4,
        head_dim=64,
        vocab_size=32000,
        make_vocab_size_divisible_by=128,
        qkv_bias=False,
    )
    root = Path(args.out or tempfile.mkdtemp(prefix="ckpt_bench_"))
    box = [str(root)]
    dist.broadcast_object_list(box, src=0)
    root = Path(box[0])
    report = {"layout": "tp2", "world_size": dist.get_world_size()}
    for spec in (tiny, m100):
        report[spec.name] = bench(spec, state, root / spec.name)
    if dist.get_rank() == 0:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
