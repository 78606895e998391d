"""`megatron-rl score`: score one completion against one problem, for debugging a reward.

    megatron-rl score --problem P.json --completion C.txt [--json]
    megatron-rl score --problem bundled --id fizzbuzz --completion - < answer.md

Runs exactly what training runs (code extraction, the sandbox, the reward mode), one case at a time,
and shows the captured output and the failing tests, which the training logs only count.
Exit code: 0 when the case was scored (whatever the reward), 1 on a sandbox error, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import load_problem
from megatron_rl.reward.result import SANDBOX_ERROR


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="megatron-rl score", description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", required=True, help="a .json/.jsonl/.parquet problem file, or 'bundled'")
    p.add_argument("--id", help="the problem's id, when the file holds more than one")
    p.add_argument("--completion", required=True, help="a file with the model's completion ('-' reads stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    p.add_argument("--mode", default="all_or_nothing", choices=["all_or_nothing", "fraction"])
    p.add_argument(
        "--timeout-s", type=float, default=10.0, help="default wall-clock limit (a problem's own wins)"
    )
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument(
        "--function", default="", help="score with an in-process verifier 'module:function' instead"
    )
    p.add_argument("--unsafe-local", action="store_true", help="run without bubblewrap (dangerous; warns)")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        problem = load_problem(args.problem, args.id)
        if args.completion == "-":
            completion = sys.stdin.read()
        else:
            with open(args.completion, encoding="utf-8", errors="replace") as f:
                completion = f.read()
    except (OSError, ValueError, KeyError, ImportError) as e:
        print(f"megatron-rl score: {e}", file=sys.stderr)
        return 2
    cfg = RewardConfig(
        kind="function" if args.function else "sandbox",
        function=args.function,
        mode=args.mode,
        unsafe_local=args.unsafe_local,
        workers=1,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
    )
    from megatron_rl.reward.pool import RewardPool  # after argument errors are reported
    from megatron_rl.reward.sandbox import SandboxUnavailable

    try:
        with RewardPool(cfg) as pool:
            (result,) = pool.score([problem], [completion])
    except (SandboxUnavailable, ValueError, ImportError, AttributeError, TypeError) as e:
        print(f"megatron-rl score: {e}", file=sys.stderr)
        return 2
    if args.json:
        keys = ("reward", "status", "seconds", "tests_passed", "tests_total", "output_tail")
        print(json.dumps({k: getattr(result, k) for k in keys}))
    else:
        print(
            f"problem {problem.id}: status {result.status}, reward {result.reward:g}, "
            f"tests {result.tests_passed}/{result.tests_total}, {result.seconds:.3f} s"
        )
        if result.output_tail:
            print("--- output (tail) ---")
            print(result.output_tail.rstrip())
    return 1 if result.status == SANDBOX_ERROR else 0
