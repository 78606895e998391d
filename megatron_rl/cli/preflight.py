"""`megatron-rl preflight RECIPE [overrides] [--json] [--out FILE]`: are these nodes fit for the run?

Run by `slurm/train.sbatch` on every rank of the job before training (one task per GPU, as the run
will), or alone on one machine, where it starts itself under torchrun as `--ranks` ranks (the cluster's
`gpus_per_node` by default). Each rank measures its device (matmul rate, memory copy bandwidth, NVML
health on a GPU) and the all-reduces it trains over; rank 0 prints one row per node against the
recipe's cluster figures (the rule: megatron_rl/system/preflight.py), then a line `PREFLIGHT {json}`
(with `--json`: the JSON alone; with `--out`: also that file).

Exit status, the same on every rank: 0 every node passed; 3 some node failed (named, with why: the
batch script stops before any rank and says which nodes to leave out); 1 the nodes passed but the
all-reduce across them did not (a ring cannot name its slow link); 2 bad input or a GPU recipe where
CUDA is unavailable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

NODE_FAILED, JOB_FAILED = 3, 1


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="megatron-rl preflight", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", help="a shipped recipe name or a path to a recipe YAML")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. cluster.preflight_gemm_fraction=0.6")
    p.add_argument("--json", action="store_true", help="print the JSON only")
    p.add_argument("--out", default="", help="also write the JSON to this file")
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="outside a launcher: ranks to start on this machine (default: the cluster's gpus_per_node)",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    from megatron_rl.config.load import load_recipe
    from megatron_rl.system.device import refusal_for

    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except Exception as e:  # RecipeNotFound, Hydra's unknown key or wrong type: one line either way
        print(f"megatron-rl preflight: recipe {args.recipe!r} does not compose: {e}", file=sys.stderr)
        return 2
    from megatron_rl.check.ranges import numeric_problems

    bad = [p for p in numeric_problems(recipe) if p.key.startswith("cluster.")]  # the figures it judges by
    if bad:
        for p in bad:
            print(f"megatron-rl preflight: {p}", file=sys.stderr)
        return 2
    refusal = refusal_for(recipe.cluster)
    if refusal:  # a GPU recipe on a machine without CUDA would measure its CPU: no verdict worth having
        print(f"megatron-rl preflight: {refusal}", file=sys.stderr)
        return 2
    from megatron_rl.parallel.dist_env import from_env

    if from_env().launcher == "single":  # alone: this machine's devices, one rank each, as a run would
        return launch_here(recipe, args)
    ranks = measure()
    return report(recipe, ranks, args)


def launch_here(recipe, args: argparse.Namespace) -> int:
    """Started by hand: run as `--ranks` (the cluster's gpus_per_node) ranks of this machine under
    torchrun, so every device is measured and the all-reduce among them too; one rank runs in-process."""
    import torch

    from megatron_rl.cli.launch_local import torchrun_here

    nproc = recipe.cluster.gpus_per_node if args.ranks is None else args.ranks
    if nproc < 1:
        print(f"megatron-rl preflight: --ranks {nproc}: give at least 1", file=sys.stderr)
        return 2
    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        print(
            f"megatron-rl preflight: cluster {recipe.cluster.name} has {nproc} GPUs per node but this "
            f"machine shows {torch.cuda.device_count()} (CUDA_VISIBLE_DEVICES, or a GPU lost: nvidia-smi); "
            f"--ranks {torch.cuda.device_count()} measures those",
            file=sys.stderr,
        )
        return 2
    if nproc == 1:
        return report(recipe, measure(), args)
    flags = [*(["--json"] if args.json else []), *(["--out", args.out] if args.out else [])]
    cmd = torchrun_here(nproc, "megatron_rl.cli.preflight", args.recipe, *args.overrides, *flags)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.call(cmd, env=env)


def measure() -> list:
    """Every rank's figures (every rank gets all of them), measured together as the run would run."""
    import torch
    import torch.distributed as dist

    from megatron_rl.parallel.dist_env import from_env
    from megatron_rl.system import preflight as pf

    env = from_env()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    mine = pf.RankFigures(
        rank=env.rank,
        host=pf.host_name(),
        device=f"GPU {env.local_rank} ({name})" if cuda else f"rank {env.rank} (cpu)",
        gemm_tflops=pf.gemm_tflops(device),
        memory_gbps=pf.memory_gbps(device),
        nvml=pf.nvml_health(torch.cuda.current_device()) if cuda else None,
    )
    if env.world_size == 1:
        return [mine]
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    try:
        cpu_group = dist.new_group(backend="gloo")
        hosts: list = [None] * env.world_size
        dist.all_gather_object(hosts, mine.host, group=cpu_group)
        order = list(dict.fromkeys(hosts))
        for host in order:  # every rank creates every node's group, in the same order
            members = [r for r, h in enumerate(hosts) if h == host]
            group = dist.new_group(members)
            if host == mine.host and len(members) > 1:
                mine.intra_gbps = pf.allreduce_gbps(group, len(members), device)
        dist.barrier(group=cpu_group)
        if len(order) > 1:
            mine.inter_gbps = pf.allreduce_gbps(None, env.world_size, device)
        everyone: list = [None] * env.world_size
        dist.all_gather_object(everyone, asdict(mine), group=cpu_group)
    finally:
        dist.destroy_process_group()
    return [pf.RankFigures(**r) for r in everyone]


def report(recipe, ranks: list, args: argparse.Namespace) -> int:
    """Judge, print on rank 0, and the exit status every rank returns."""
    from megatron_rl.parallel.dist_env import from_env
    from megatron_rl.system.preflight import Expected, judge

    c = recipe.cluster
    expect = Expected.from_cluster(c)
    nodes, job = judge(ranks, expect)
    failed = [n.host for n in nodes if not n.passed]
    out = {
        "recipe": recipe.name,
        "cluster": c.name,
        "expected": asdict(expect),
        "nodes": [
            {"host": n.host, "ranks": n.ranks, **n.figures, "passed": n.passed, "failures": n.failures}
            for n in nodes
        ],  # fmt: skip
        "job_failures": job,
        "passed": not failed and not job,
        "exclude": failed,
        "ranks": [asdict(r) for r in ranks],
    }
    code = NODE_FAILED if failed else JOB_FAILED if job else 0
    if from_env().rank != 0:
        return code
    text = json.dumps(out, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text, flush=True)
        return code
    print("\n".join(table(recipe, nodes, job, expect)), flush=True)
    print(f"PREFLIGHT {text}", flush=True)
    return code


def table(recipe, nodes: list, job: list[str], e) -> list[str]:
    """The console form: one row per node, each figure with what it needs."""
    c = recipe.cluster
    lines = [
        f"megatron-rl preflight: {len(nodes)} node(s), {sum(len(n.ranks) for n in nodes)} rank(s), "
        f"cluster {c.name} ({c.gpu}); each figure must reach the fraction of the cluster's shown in ()",
        f"  {'node':<20} {'ranks':>5}  {'gemm TFLOPS':>22}  {'memory GB/s':>22}  {'all-reduce GB/s':>22}  "
        "verdict",
    ]

    def cell(got, want, fraction):
        return "-" if got is None else f"{got:.3g} (>= {want * fraction:.3g})"

    for n in nodes:
        f = n.figures
        lines.append(
            f"  {n.host:<20} {len(n.ranks):>5}  {cell(f['gemm_tflops'], e.gemm_tflops, e.gemm_fraction):>22}  "
            f"{cell(f['memory_gbps'], e.memory_gbps, e.memory_fraction):>22}  "
            f"{cell(f['allreduce_intra_gbps'], e.intra_gbps, e.allreduce_fraction):>22}  "
            + ("ok" if n.passed else "FAILED: " + "; ".join(n.failures))
        )
    lines += [f"  across nodes: FAILED: {p}" for p in job]
    bad = [n.host for n in nodes if not n.passed]
    if bad:
        lines.append(f"leave out: {','.join(bad)} (sbatch --exclude={','.join(bad)})")
    return lines


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
