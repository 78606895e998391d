"""`megatron-rl score`: score completions against problems, one case or a whole file.

    megatron-rl score --problem P.json --completion C.txt [--json]
    megatron-rl score --problem bundled --id fizzbuzz --completion - < answer.md
    megatron-rl score --problems HumanEval.jsonl.gz --completions samples.jsonl [--json]

Runs exactly what training runs (code extraction, the problem's code before it, the sandbox, the
reward mode). One case shows the captured output and the failing tests, which the training logs only
count; a file of completions is scored through the whole pool (`batch.py` says what it prints:
one record per completion in the file's order, then pass@1 per problem and overall).
Exit code: 0 when everything was scored (whatever the rewards), 1 when a sandbox error kept one from
being scored, 2 on bad input (one line on stderr, never a traceback). What a program printed is shown
with control and format characters escaped (`\x1b`, `\r`, `\u202e`): a completion's ANSI escapes must
not redraw the report into a fake "passed".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata

from megatron_rl.check.ranges import NUMERIC, range_text
from megatron_rl.cli import score_batch as batch
from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import load_problem, load_problems
from megatron_rl.reward.result import SANDBOX_ERROR


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line and exit 2, instead of argparse's usage block."""
        print(f"megatron-rl score: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _host_memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def _in_range(key: str, kind: type, high: float | None = None) -> object:
    """A parser for a number in the recipe key's range (check_ranges.NUMERIC), at most `high`."""
    lo, hi, lo_in, hi_in = NUMERIC[key]
    if high is not None and (hi is None or high < hi):
        hi, hi_in = high, True

    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = value == value and (value > lo or (lo_in and value == lo))
        inside = inside and (hi is None or value < hi or (hi_in and value == hi))
        if not inside:
            raise argparse.ArgumentTypeError(
                f"must be finite and {range_text(lo, hi, lo_in, hi_in)} (as {key}); got {text!r}"
            )
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
        help="one case: 'bundled', a .json/.jsonl(.gz)/.parquet file, a saved `datasets` folder, a folder or glob",
    )
    p.add_argument("--id", help="the problem's id, when the file holds more than one")
    p.add_argument("--completion", help="one case: a file with the model's completion ('-' reads stdin)")
    p.add_argument("--problems", help="a whole problem set (any source --problem takes), with --completions")
    p.add_argument(
        "--completions", help='a JSONL file of {"id": ..., "completion": ...} lines, with --problems'
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a report")
    p.add_argument(
        "--workers",
        type=_in_range("reward.workers", int),
        default=None,
        help="sandboxes scoring a file at once (default: one per CPU)",
    )
    add_reward_options(p)
    return p


def add_reward_options(p: argparse.ArgumentParser) -> None:
    """How a completion is scored: the options `score` and `reward-server` share (`reward_config`)."""
    p.add_argument("--mode", default="all_or_nothing", choices=["all_or_nothing", "fraction"])
    p.add_argument(
        "--timeout-s",
        type=_in_range("reward.timeout_s", float),
        default=10.0,
        help="default wall-clock limit (a problem's own wins)",
    )
    p.add_argument(
        "--memory-mb",
        type=_in_range("reward.memory_mb", int, high=_host_memory_mb()),
        default=512,
        help="the job's memory limit, MiB (at most this machine's memory)",
    )
    p.add_argument(
        "--function", default="", help="score with an in-process verifier 'module:function' instead"
    )
    p.add_argument("--unsafe-local", action="store_true", help="run without bubblewrap (dangerous; warns)")


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help, or a bad argument already reported in one line
        return e.code if isinstance(e.code, int) else 2
    one, many = (args.problem, args.completion), (args.problems, args.completions)
    if all(many) and not any(one) and not args.id:
        return _score_file(args)
    if all(one) and not any(many):
        return _score_one(args)
    print(
        "megatron-rl score: give --problem and --completion (one case) or --problems and --completions "
        "(a file of them), not a mix (see --help)",
        file=sys.stderr,
    )
    return 2


def reward_config(args: argparse.Namespace, workers: int) -> RewardConfig:
    """The RewardConfig of `add_reward_options`' arguments, with `workers` sandboxes."""
    return RewardConfig(
        kind="function" if args.function else "sandbox",
        function=args.function,
        mode=args.mode,
        unsafe_local=args.unsafe_local,
        workers=workers,
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
    )


def _fail(e: BaseException) -> int:
    print(f"megatron-rl score: {printable(str(e))}", file=sys.stderr)
    return 2


def _score_one(args: argparse.Namespace) -> int:
    try:
        problem = load_problem(args.problem, args.id)
        if args.completion == "-":
            completion = sys.stdin.read()
        else:
            with open(args.completion, encoding="utf-8", errors="replace") as f:
                completion = f.read()
    except (OSError, ValueError, KeyError, ImportError) as e:
        return _fail(e)
    from megatron_rl.reward.pool import RewardPool  # after argument errors are reported
    from megatron_rl.reward.sandbox import SandboxUnavailable

    try:
        with RewardPool(reward_config(args, 1)) as pool:
            (result,) = pool.score([problem], [completion])
    except (SandboxUnavailable, ValueError, ImportError, AttributeError, TypeError) as e:
        return _fail(e)
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


def _score_file(args: argparse.Namespace) -> int:
    try:
        problems = load_problems(args.problems)
        todo = batch.read_completions(args.completions, problems)
    except (OSError, ValueError, KeyError, ImportError) as e:
        return _fail(e)
    from megatron_rl.reward.pool import RewardPool  # after argument errors are reported
    from megatron_rl.reward.sandbox import SandboxUnavailable, default_workers

    workers = min(args.workers or default_workers(), len(todo))
    rows = []
    try:
        with RewardPool(reward_config(args, workers)) as pool:
            for i, item in enumerate(todo):
                pool.submit(i, item.problem, item.text)
            for result in batch.in_order(pool.results(len(todo)), len(todo)):
                row = batch.record(todo[result.sample_id], result)
                rows.append(row)
                batch.print_row(row, args.json, sys.stdout, printable)
    except (SandboxUnavailable, ValueError, ImportError, AttributeError, TypeError) as e:
        return _fail(e)
    batch.print_summary(batch.summary(rows), args.json, sys.stdout)
    return 1 if any(r["status"] == SANDBOX_ERROR for r in rows) else 0
