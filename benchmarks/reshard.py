"""Publication throughput vs a raw all_gather of the same bytes, and peak extra memory vs bucket size.

  python benchmarks/reshard.py            # launches itself under torchrun with 4 processes (gloo, CPU)
  python benchmarks/reshard.py --nproc 8  # (on a GPU node: NCCL, one process per GPU)
  python benchmarks/reshard.py --smoke    # a 2-layer model, one repeat, two small buckets (the suite's run)

Model: a ~100M-parameter Llama-style config in bf16 (12 layers, hidden 768, 12 heads in 4 KV groups,
vocab 16384, untied). Trainer shards are random tensors of the exact megatron shapes (what the
publisher reads; building megatron would only add start-up time). Per layout: one warm-up
publication (plan, connections), then `--repeats` rounds of one timed publication and one raw
`all_gather` on the same group moving the same number of bytes in total; the best of each.

Prints JSON: per layout, bytes moved across processes (sum over receivers), publish seconds (max
over ranks) and throughput, the same for the all_gather, their ratio (publish throughput / all_gather
throughput; >= 0.9 is the target), the part of the publish spent hashing, and, per bucket size, the
peak extra memory (max over ranks) against its bound (bucket + largest tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def spec(smoke: bool = False):
    from megatron_rl.models.tiny import tiny_spec

    if smoke:  # every layout and code path at a size that publishes in milliseconds
        return tiny_spec(
            name="llama_smoke",
            family="llama",
            num_layers=2,
            hidden_size=256,
            ffn_hidden_size=512,
            num_attention_heads=4,
            num_query_groups=4,
            vocab_size=512,
            make_vocab_size_divisible_by=128,
            qkv_bias=False,
            params_dtype="bf16",
        )
    return tiny_spec(
        name="llama_100m",
        family="llama",
        num_layers=12,
        hidden_size=768,
        ffn_hidden_size=2048,
        num_attention_heads=12,
        num_query_groups=4,
        vocab_size=16384,
        make_vocab_size_divisible_by=128,
        max_position_embeddings=2048,
        norm_eps=1e-5,
        qkv_bias=False,
        params_dtype="bf16",
    )


# (name, layout kwargs, delivery)
LAYOUTS = [
    ("tp4_to_4xtp1_loader", dict(tp=4, engine_tp=1, engine_count=4), "loader"),
    ("tp2pp2_to_2xtp2_inplace", dict(tp=2, pp=2, engine_tp=2, engine_count=2), "inplace"),
    ("tp1pp2dp2_to_4xtp1_inplace", dict(tp=1, pp=2, dp=2, engine_tp=1, engine_count=4), "inplace"),
    ("sep_tp2_to_tp2_inplace", dict(tp=2, engine_tp=2, engine_count=1, placement="separated"), "inplace"),
]
BUCKETS_MIB = [4, 16, 64]
SMOKE_BUCKETS_MIB = [1, 4]


def _shards(plan, rank, dtype, device):
    import torch

    g = torch.Generator().manual_seed(rank)
    return {
        n: torch.randn(t.shape, generator=g).to(dtype).to(device)
        for n, t in plan.sources.get(rank, {}).items()
    }


def _max(x: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _sum(x: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def _publish_once(pub, shards):
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    r = pub.publish(shards.items(), step=0)
    dt = time.perf_counter() - t0
    if not r.activated:
        raise RuntimeError(f"benchmark publication rejected: {r.problems[:3]}")
    return dt, r


class _AllGather:
    """A raw all_gather on the world moving `total_bytes` across processes in all."""

    def __init__(self, total_bytes: float, device):
        import torch
        import torch.distributed as dist

        w = dist.get_world_size()
        n = max(1, int(total_bytes // (w * (w - 1))))
        self.x = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
        self.outs = [torch.empty_like(self.x) for _ in range(w)]
        dist.all_gather(self.outs, self.x)  # warm-up

    def seconds(self) -> float:
        import torch.distributed as dist

        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather(self.outs, self.x)
        return _max(time.perf_counter() - t0)


def worker(repeats: int, smoke: bool) -> None:
    import torch
    import torch.distributed as dist

    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.reshard.plan import Links
    from megatron_rl.reshard.publish import InMemorySink, Publisher

    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if gpu else "gloo")
    cpu_group = dist.new_group(backend="gloo")  # the publisher's host objects (its problems)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if gpu else torch.device("cpu")
    s = spec(smoke)
    links = Links(gpus_per_node=world)
    out = {
        "model": s.name,
        "params": s.num_params(),
        "dtype": "bf16",
        "world": world,
        "backend": dist.get_backend(),
        "layouts": {},
    }

    for name, kw, delivery in LAYOUTS:
        lay = ParallelLayout(**kw)
        if lay.world_size != world:
            continue
        coord = lay.engine_coord(rank)
        pub = Publisher(
            lay,
            s,
            InMemorySink() if coord else None,
            delivery,
            64 * MiB,
            links,
            torch.bfloat16,
            device=device,
            cpu_group=cpu_group,
        )
        shards = _shards(pub.plan, rank, torch.bfloat16, device)
        _, warm = _publish_once(pub, shards)  # warm-up: plan, connections, allocator
        moved = _sum(sum(warm.stats.recv.values()))
        gather = _AllGather(moved, device)
        # Publication and all_gather alternate, so both see the same machine (other jobs come and go).
        best, res, ag = float("inf"), None, float("inf")
        for _ in range(repeats):
            dt, r = _publish_once(pub, shards)
            dt = _max(dt)
            if dt < best:
                best, res = dt, r
            ag = min(ag, gather.seconds())
        out["layouts"][name] = {
            "delivery": delivery,
            "bytes_moved": int(moved),
            "bytes_staged_per_engine_rank": pub.plan.target_bytes(pub.plan.layout.engine_ranks(0)[0]),
            "publish_s": best,
            "publish_GBps": moved / best / 1e9,
            "all_gather_s": ag,
            "all_gather_GBps": moved / ag / 1e9,
            "ratio": ag / best,
            "transfer_s": _max(res.seconds["transfer"]),
            "validate_s": _max(res.seconds["validate"]),
            "hash_s_in_transfer": _max(res.stats.hash_seconds),
            "lower_bound_s_at_cluster_rates": pub.plan.lower_bound_s()[0],
        }

    # Peak extra memory vs bucket size, on the first layout (every rank sends and receives).
    name, kw, delivery = LAYOUTS[0]
    lay = ParallelLayout(**kw)
    sweep = []
    if lay.world_size == world:
        for mib in SMOKE_BUCKETS_MIB if smoke else BUCKETS_MIB:
            coord = lay.engine_coord(rank)
            pub = Publisher(
                lay,
                s,
                InMemorySink() if coord else None,
                delivery,
                mib * MiB,
                links,
                torch.bfloat16,
                device=device,
                cpu_group=cpu_group,
            )
            shards = _shards(pub.plan, rank, torch.bfloat16, device)
            dt, r = _publish_once(pub, shards)
            bound = mib * MiB + pub.plan.largest_tensor_bytes()
            peak = _max(r.stats.peak_extra_bytes)
            sweep.append(
                {
                    "bucket_MiB": mib,
                    "peak_extra_MiB": peak / MiB,
                    "bound_MiB": bound / MiB,
                    "within_bound": peak <= bound,
                    "buckets": r.stats.buckets,
                    "publish_s": _max(dt),
                }
            )
    out["memory_vs_bucket"] = {
        "layout": name,
        "largest_tensor_MiB": pub.plan.largest_tensor_bytes() / MiB,
        "sweep": sweep,
    }
    if rank == 0:
        print("BENCH_JSON " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--smoke", action="store_true", help="a 2-layer model, one repeat, buckets of 1 and 4 MiB"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.repeats = 1
    if args.worker:
        worker(args.repeats, args.smoke)
        return 0
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(args.nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        __file__,
        "--worker",
        "--repeats",
        str(args.repeats),
        *(["--smoke"] if args.smoke else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write((proc.stdout + proc.stderr)[-4000:])
        return proc.returncode or 1
    print(json.dumps(json.loads(lines[-1][len("BENCH_JSON ") :]), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
