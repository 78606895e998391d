"""`megatron-rl score`: score one completion against one problem, for debugging a reward.

    megatron-rl score --problem P.json --completion C.txt [--json]
    megatron-rl score --problem bundled --id fizzbuzz --completion - < answer.md

Runs exactly what training runs (code extraction, the sandbox, the reward mode), one case at a time,
and shows the captured output and the failing tests, which the training logs only count.
Exit code: 0 when the case was scored (whatever the reward), 1 on a sandbox error, 2 on bad input
(one line on stderr, never a traceback). What the program printed is shown with control and format
characters escaped (`\x1b`, `\r`, `\u202e`): a completion's ANSI escapes must not redraw the
report into a fake "passed".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import unicodedata

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import load_problem
from megatron_rl.reward.result import SANDBOX_ERROR


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line and exit 2, instead of argparse's usage block."""
        print(f"megatron-rl score: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _positive(kind: type) -> object:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def printable(text: str) -> str:
    """`text` with control and format characters escaped, newlines and tabs kept."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Co", "Cs", "Zl", "Zp"):
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
    return "".join(out)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="megatron-rl score", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--problem",
        required=True,
        help="'bundled', a .json/.jsonl/.parquet file, a saved `datasets` folder, a folder or glob of files",
    )
    p.add_argument("--id", help="the problem's id, when the file holds more than one")
    p.add_argument("--completion", required=True, help="a file with the model's completion ('-' reads stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    p.add_argument("--mode", default="all_or_nothing", choices=["all_or_nothing", "fraction"])
    p.add_argument(
        "--timeout-s",
        type=_positive(float),
        default=10.0,
        help="default wall-clock limit (a problem's own wins)",
    )
    p.add_argument("--memory-mb", type=_positive(int), default=512, help="the job's memory limit, MiB")
    p.add_argument(
        "--function", default="", help="score with an in-process verifier 'module:function' instead"
    )
    p.add_argument("--unsafe-local", action="store_true", help="run without bubblewrap (dangerous; warns)")
    return p


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help, or a bad argument already reported in one line
        return e.code if isinstance(e.code, int) else 2
    try:
        problem = load_problem(args.problem, args.id)
        if args.completion == "-":
            completion = sys.stdin.read()
        else:
            with open(args.completion, encoding="utf-8", errors="replace") as f:
                completion = f.read()
    except (OSError, ValueError, KeyError, ImportError) as e:
        print(f"megatron-rl score: {printable(str(e))}", file=sys.stderr)
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
        print(f"megatron-rl score: {printable(str(e))}", file=sys.stderr)
        return 2
    if args.json:
        keys = ("reward", "status", "seconds", "tests_passed", "tests_total", "output_tail")
        print(json.dumps({k: getattr(result, k) for k in keys}))
    else:
        print(
            f"problem {printable(problem.id)}: status {result.status}, reward {result.reward:g}, "
            f"tests {result.tests_passed}/{result.tests_total}, {result.seconds:.3f} s"
        )
        if result.output_tail:
            print("--- output (tail) ---")
            print(printable(result.output_tail.rstrip()))
    return 1 if result.status == SANDBOX_ERROR else 0
