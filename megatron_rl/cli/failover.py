"""`python -m megatron_rl.cli.failover`: the decisions slurm/train.sbatch asks for when nodes fail.

    failover nodes RECIPE [overrides]      # prints "<cluster.nodes> <cluster.max_restarts>"
    failover after --exit-dir D --rc RC --used a,c --allocated "a b c d" --bad b --restarts 0 --max 3
        # prints "retry <nodes> <blamed>" or "stop - <blamed>" (blamed: comma list or -); why on stderr
    failover pick --allocated "a b c" --bad b [--need 2]       # prints "a,c" (the first 2 healthy, or all);
        # fewer than --need: exit 1, the lack named on stderr
    failover preflight --json F --rc RC --allocated "a b c" --bad "" --need 2
        # prints "ok|spare|stop|ring|refused <failed nodes or ->"

The rules are megatron_rl/system/failover.py's; this file only reads the script's words and the exit
folder. A folder it cannot read is an error (exit 2), never "no failure".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megatron_rl.system.failover import after, after_preflight, healthy, pick, read_beats, read_exit_records


def job_settings(recipe_arg: str, overrides: list[str]) -> tuple[int, int]:
    """The run's node count and how often a job may restart it, from the recipe."""
    from megatron_rl.config.load import load_recipe

    cluster = load_recipe(recipe_arg, overrides).cluster
    return cluster.nodes, cluster.max_restarts


def _hosts(text: str) -> list[str]:
    return [h for h in text.replace(",", " ").split() if h]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="megatron-rl failover", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    n = sub.add_parser("nodes", help="the run's nodes and restart budget, from the recipe")
    n.add_argument("recipe")
    n.add_argument("overrides", nargs="*")
    k = sub.add_parser("pick", help="the healthy nodes, in allocation order: the first --need of them")
    k.add_argument("--need", type=int, default=0, help="how many (0: all of them)")
    f = sub.add_parser("preflight", help="what the job does after the preflight")
    f.add_argument("--json", type=Path, required=True, help="rank 0's verdict (megatron-rl preflight --out)")
    f.add_argument("--rc", type=int, required=True)
    f.add_argument("--need", type=int, required=True)
    a = sub.add_parser("after", help="what the job does after a failed step")
    for q in (a, f, k):
        q.add_argument("--allocated", required=True, help="the job's nodes, in order")
        q.add_argument("--bad", default="", help="nodes left out already")
    a.add_argument("--exit-dir", type=Path, required=True)
    a.add_argument("--rc", type=int, required=True)
    a.add_argument("--used", required=True)
    a.add_argument("--restarts", type=int, required=True)
    a.add_argument("--max", type=int, required=True)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    if args.what == "nodes":
        nodes, restarts = job_settings(args.recipe, args.overrides)
        print(nodes, restarts)
        return 0
    allocated, bad = _hosts(args.allocated), set(_hosts(args.bad))
    if args.what == "pick":
        try:
            nodes = pick(allocated, bad, args.need) if args.need else healthy(allocated, bad)
        except LookupError as e:
            print(f"failover: {e}", file=sys.stderr)
            return 1
        print(",".join(nodes))
        return 0
    if args.what == "preflight":
        try:
            verdict = json.loads(args.json.read_text())
        except (OSError, ValueError):
            verdict = None  # no verdict: the failure stands unexplained (refused)
        action, failed = after_preflight(verdict, args.rc, allocated, bad, args.need)
        print(action, ",".join(failed) or "-")
        return 0
    try:
        records = read_exit_records(args.exit_dir) if args.exit_dir.is_dir() else []
        beats = read_beats(args.exit_dir) if args.exit_dir.is_dir() else []
    except (OSError, ValueError) as e:
        print(f"failover: cannot read the step's exit folder {args.exit_dir}: {e}", file=sys.stderr)
        return 2
    v = after(args.rc, records, beats, _hosts(args.used), allocated, bad, args.restarts, args.max)
    for host, why in sorted(v.blamed.items()):
        print(f"== node {host} failed: {why}", file=sys.stderr)
    if v.why:
        print(f"== {v.why}", file=sys.stderr)
    print(v.action, ",".join(v.nodes) or "-", ",".join(sorted(v.blamed)) or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
