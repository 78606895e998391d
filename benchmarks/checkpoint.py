"""Checkpoint save, verify and load time and size: the tiny recipe's model and a ~100M-parameter config, at TP2.

    torchrun --nproc-per-node 2 benchmarks/checkpoint.py [--out DIR] [--repeats N] [--smoke]

For each model: one optimizer step (so the Adam state exists), then a synchronous save and an
asynchronous one (time until training may continue, and time until the COMPLETE marker), the bytes on
disk, a full verification (every file re-hashed against the manifest) and a load back at the same
layout. The cost of integrity on the async save's blocking time is measured side by side in this
run: `Checkpointer.save` (space check, temp directory, background checksums) against a bare
megatron-core async save of the same state (`baseline_async`, the save without any of it), alternated
`--repeats` times; `blocking_overhead` is the ratio of their medians minus one (`_min`: of their
minima, less sensitive to other load on the machine). Prints one JSON object (rank 0). `--smoke`: the
tiny model only, one repeat (the suite's run).
"""

import argparse
import json
import shutil
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


def baseline_async_save(step: int, pol, root: Path, run) -> float:
    """A bare async save (what a save cost before integrity): blocking seconds; finalised before return."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    from megatron_rl.checkpoint.save import FORMAT, sharded_state
    from megatron_rl.checkpoint.state import rng_state

    queue = AsyncCallsQueue()
    t0 = time.perf_counter()
    path = root / f"step_{step:06d}"
    if run.is_main:
        (path / "dist").mkdir(parents=True, exist_ok=True)
        (path / "run_state.json").write_text(json.dumps({"step": step}))
    dist.barrier()
    torch.save(rng_state(), path / f"rank_{run.rank:05d}.pt")
    request = dist_checkpointing.save(
        sharded_state(pol, None), str(path / "dist"), async_sharded_save=True, content_metadata=FORMAT
    )
    queue.schedule_async_request(request)
    blocking = time.perf_counter() - t0
    queue.maybe_finalize_async_calls(blocking=True)
    queue.close()
    return blocking


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def bench(spec, state, root: Path, repeats: int) -> dict:
    from megatron_rl.checkpoint.integrity import verify
    from megatron_rl.checkpoint.resume import load
    from megatron_rl.checkpoint.save import Checkpointer
    from megatron_rl.checkpoint.store import is_complete
    from megatron_rl.trainer.policy import OptimSettings, Policy

    pol = Policy(spec, state, optim=OptimSettings(lr=1e-4), micro_batch_size=2)
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
    # integrity's cost on the async save's blocking time, side by side (alternated, medians)
    with_integrity, baseline = [], []
    for i in range(repeats):
        ck = Checkpointer(root / "paired", run, keep_last=1, async_save=True)
        dist.barrier()
        t0 = time.perf_counter()
        ck.save(i + 1, pol, None, {"step": i + 1, "world_size": dist.get_world_size(), "task": {}})
        with_integrity.append(time.perf_counter() - t0)
        ck.close()
        dist.barrier()
        baseline.append(baseline_async_save(i + 1, pol, root / "baseline", run))
        dist.barrier()
    out["async_blocking_with_integrity_s"] = [round(x, 3) for x in with_integrity]
    out["baseline_async_blocking_s"] = [round(x, 3) for x in baseline]
    out["blocking_overhead"] = round(_median(with_integrity) / _median(baseline) - 1.0, 4)
    out["blocking_overhead_min"] = round(min(with_integrity) / min(baseline) - 1.0, 4)
    t0 = time.perf_counter()
    problems = verify(root / "sync" / "step_000001") if dist.get_rank() == 0 else []
    out["verify_s"] = round(time.perf_counter() - t0, 3)
    out["verifies"] = not problems
    dist.barrier()
    t0 = time.perf_counter()

    class _Task:
        def load_state(self, s):
            pass

    load(root / "sync" / "step_000001", run.rank, pol, None, _Task())
    out["load_s"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None, help="where to write (kept); default: a temporary folder, removed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="the tiny model only, one repeat")
    args = p.parse_args()
    if args.smoke:
        args.repeats = 1
    from megatron_rl.config.load import load_recipe
    from megatron_rl.models.spec import ModelSpec
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.trainer.parallel import init_parallel, launched_world

    state = init_parallel(ParallelLayout.over(launched_world(), 2, 1))
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
    # rank 0 picks the folder (one mkdtemp, not one per rank) and tells the others
    box = [args.out or (tempfile.mkdtemp(prefix="ckpt_bench_") if dist.get_rank() == 0 else "")]
    dist.broadcast_object_list(box, src=0, group=state.cpu_group)
    root = Path(box[0])
    report = {"layout": "tp2", "world_size": dist.get_world_size()}
    for spec in (tiny,) if args.smoke else (tiny, m100):
        report[spec.name] = bench(spec, state, root / spec.name, args.repeats)
    dist.barrier()
    if dist.get_rank() == 0:
        print(json.dumps(report, indent=1))
        if not args.out:  # several GB per run: a benchmark must not fill the disk it measures
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
