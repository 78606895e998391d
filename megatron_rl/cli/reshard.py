"""`megatron-rl reshard-plan RECIPE [overrides] [--json]`: the weight-publication plan of a recipe.

Prints what every publication of the recipe will do before any GPU is rented: how each engine
tensor is obtained (local view or copy, TP gather, pipeline stage, other replica, across pools),
the bytes each rank sends and receives per link class, and the lower bound on the transfer time
from the cluster's link rates.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from megatron_rl.reshard.convert import DELIVERIES
from megatron_rl.reshard.plan import ReshardPlan


def summarize(plan: ReshardPlan, bucket_bytes: int) -> dict:
    """The plan in numbers (JSON-ready): layouts, ops, bytes per link class, busiest ranks, bound."""
    lay, spec = plan.layout, plan.spec
    rb = plan.rank_bytes()
    ops: dict[str, dict[str, int]] = defaultdict(lambda: {"tensors": 0, "bytes": 0})
    for (dst, name), op in plan.ops().items():
        ops[op]["tensors"] += 1
        ops[op]["bytes"] += plan.targets[dst][name].numel * plan.dtype_bytes
    totals = {k: sum(b[k] for b in rb.values()) for k in ("sent_intra", "sent_inter", "local")}
    busiest = max(rb.items(), key=lambda kv: kv[1]["recv_intra"] + kv[1]["recv_inter"], default=(None, {}))
    bound_s, bound_why = plan.lower_bound_s()
    buckets = plan.buckets(bucket_bytes)
    return {
        "model": spec.name,
        "params": spec.num_params(spec.padded_vocab(lay.tp)),
        "dtype_bytes": plan.dtype_bytes,
        "trainer": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ranks": lay.trainer_world},
        "engines": {"tp": lay.engine_tp, "count": lay.engine_count, "ranks": lay.engine_world},
        "placement": "colocated" if lay.colocated else "separated",
        "delivery": plan.delivery,
        "links": {
            "gpus_per_node": plan.links.gpus_per_node,
            "intra_GBps": plan.links.intra_bytes_s / 1e9,
            "inter_GBps_per_node": plan.links.inter_bytes_s / 1e9,
        },
        "ops": dict(sorted(ops.items())),
        "pieces": len(plan.pieces),
        "bytes": {
            "staged_per_engine_rank": max((plan.target_bytes(r) for r in plan.targets), default=0),
            "staged_total": sum(plan.target_bytes(r) for r in plan.targets),
            "intra_node": totals["sent_intra"],
            "inter_node": totals["sent_inter"],
            "local_copy": totals["local"],
        },
        "busiest_receiver": {"rank": busiest[0], **busiest[1]},
        "lower_bound_s": bound_s,
        "lower_bound_by": bound_why,
        "buckets": {"bytes": bucket_bytes, "count": len(buckets)},
        "peak_extra_bytes_bound": bucket_bytes + plan.largest_tensor_bytes(),
    }


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e7 else f"{n / 1e6:.3f} MB"


def render(s: dict) -> str:
    t, e = s["trainer"], s["engines"]
    lines = [
        f"reshard plan: {s['model']} ({s['params'] / 1e9:.2f} B params, {s['dtype_bytes']} bytes each)",
        f"  trainer tp{t['tp']} x pp{t['pp']} x dp{t['dp']} x cp{t['cp']} ({t['ranks']} ranks) -> "
        f"{e['count']} engine(s) x tp{e['tp']}, {s['placement']}, delivery={s['delivery']}",
        f"  links: {s['links']['gpus_per_node']} GPUs/node, intra {s['links']['intra_GBps']:.0f} GB/s per GPU, "
        f"inter {s['links']['inter_GBps_per_node']:.0f} GB/s per node",
        "  how each engine tensor is obtained (tensors over all engine ranks, bytes staged):",
    ]
    for op, v in s["ops"].items():
        lines.append(f"    {op:<28} {v['tensors']:>8}  {_gb(v['bytes'])}")
    b = s["bytes"]
    lines += [
        f"  staged: {_gb(b['staged_per_engine_rank'])} per engine rank, {_gb(b['staged_total'])} in all",
        f"  moved: intra-node {_gb(b['intra_node'])}, inter-node {_gb(b['inter_node'])}, "
        f"local copies {_gb(b['local_copy'])} ({s['pieces']} pieces)",
    ]
    br = s["busiest_receiver"]
    if br.get("rank") is not None:
        lines.append(
            f"  busiest receiver: rank {br['rank']} (intra {_gb(br['recv_intra'])}, inter {_gb(br['recv_inter'])})"
        )
    lines += [
        f"  lower bound: {s['lower_bound_s'] * 1e3:.2f} ms ({s['lower_bound_by']})",
        f"  buckets: {s['buckets']['count']} of {_gb(s['buckets']['bytes'])}; "
        f"extra memory per rank <= {_gb(s['peak_extra_bytes_bound'])} (bucket + largest tensor)",
    ]
    return "\n".join(lines)


def rank_table(plan: ReshardPlan, rank: int) -> list[dict]:
    """One engine rank's tensors: shape, op, the trainer ranks chosen to send, and all that hold the rows."""
    if rank not in plan.targets:
        raise ValueError(f"rank {rank} is not an engine rank (engine ranks: {sorted(plan.targets)[:8]}...)")
    ops = plan.ops()
    rows = []
    for name, t in plan.targets[rank].items():
        pieces = [plan.pieces[i] for i in plan.by_target[(rank, name)]]
        holders = set()
        for p in pieces:  # every rank holding an identical shard (DP/CP replicas; all TP ranks if replicated)
            shard = plan.sources[p.src][p.src_name]
            holders |= {r for r, names in plan.sources.items() if names.get(p.src_name) == shard}
        rows.append(
            {
                "name": name,
                "shape": list(t.shape),
                "op": ops[(rank, name)],
                "sources": sorted({p.src for p in pieces}),
                "holders": sorted(holders),
                "bytes": t.numel * plan.dtype_bytes,
            }
        )
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="megatron-rl reshard-plan", description=__doc__.split("\n")[0])
    ap.add_argument("recipe", help="shipped recipe name or path to a recipe YAML")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. layout.engine_tp=4")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument(
        "--delivery",
        choices=DELIVERIES,
        default=None,
        help="inplace (GPU default) or loader (whole HF tensors; the vLLM CPU build)",
    )
    ap.add_argument("--bucket-mb", type=float, default=256.0, help="transfer bucket size in MiB")
    ap.add_argument("--rank", type=int, default=None, help="also list one engine rank's tensors")
    args = ap.parse_args(argv)

    from megatron_rl.check.recipe import checked, refused
    from megatron_rl.config.load import RecipeError, RecipeNotFound, load_recipe
    from megatron_rl.reshard.plan import Links, build_plan

    try:
        recipe = load_recipe(args.recipe, args.overrides)
        found, run = checked(recipe, read_data=False)  # the driver's check; separated layouts plan too
        problems = refused(found, "plan")
        if problems or run is None:
            listed = "\n".join(f"  - {p}" for p in problems or found)
            raise RecipeError(f"recipe {recipe.name!r} is invalid (megatron-rl validate):\n{listed}")
        spec = run.spec
        plan = build_plan(
            run.layout,
            spec,
            args.delivery or run.delivery,
            Links.from_cluster(recipe.cluster),
            spec.dtype_bytes,
        )
        summary = summarize(plan, int(args.bucket_mb * (1 << 20)))
        if args.rank is not None:
            summary["rank"] = {"rank": args.rank, "tensors": rank_table(plan, args.rank)}
    except (RecipeNotFound, ValueError) as e:
        print(f"megatron-rl reshard-plan: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(render(summary))
    if args.rank is not None:
        print(f"  engine rank {args.rank}:")
        for row in summary["rank"]["tensors"]:
            print(
                f"    {row['name']:<48} {str(row['shape']):<16} {row['op']:<24} "
                f"from {row['sources']} (held by {row['holders']})"
            )
    return 0
