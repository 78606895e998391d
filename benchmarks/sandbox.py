"""Executions per second of a trivial passing program: sandboxed vs a bare `python -c` subprocess.

    python benchmarks/sandbox.py [--runs 200] [--workers N]

Three ways to run the same program and its test, in one process, interleaved in small blocks so
that background load hits all of them alike:
- bare:           `python -c "<program + tests>"` with this interpreter, as a user would run it
                  (site-packages imported: the cost a venv's .pth files add is part of it);
- bare_isolated:  `python -I -S -c ...`, the cheapest interpreter start there is (no site);
- sandboxed:      `Sandbox.run` (bubblewrap, per-job namespaces, the verdict split of harness.py).
Then the same at pool scale: `--workers` concurrent bare subprocesses vs a RewardPool of that size.
Prints one JSON object; `ratio_*` is sandboxed seconds per execution over the baseline's (the target
is <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import Problem
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.sandbox import Sandbox, SandboxLimits, default_workers, find_bwrap

CODE = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"


def bare(flags: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *flags, "-c", CODE + TESTS], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def summary(seconds: list[float]) -> dict[str, float]:
    mean = statistics.fmean(seconds)
    return {
        "per_s": round(1 / mean, 1),
        "mean_ms": round(1000 * mean, 2),
        "median_ms": round(1000 * statistics.median(seconds), 2),
    }


def sequential(runs: int, block: int = 10) -> dict:
    with Sandbox(SandboxLimits(timeout_s=10), bwrap=find_bwrap()) as sandbox:
        sandbox.start()
        for _ in range(3):  # warm both paths
            assert sandbox.run(CODE, TESTS, "add")["status"] == "passed"
            bare([])
        times: dict[str, list[float]] = {"bare": [], "bare_isolated": [], "sandboxed": []}
        for _ in range(0, runs, block):
            times["bare"] += [bare([]) for _ in range(block)]
            times["bare_isolated"] += [bare(["-I", "-S"]) for _ in range(block)]
            for _ in range(block):
                start = time.perf_counter()
                record = sandbox.run(CODE, TESTS, "add")
                times["sandboxed"].append(time.perf_counter() - start)
                assert record["status"] == "passed", record
    out = {name: summary(t) for name, t in times.items()}
    sandboxed = statistics.fmean(times["sandboxed"])
    out["ratio_vs_bare"] = round(sandboxed / statistics.fmean(times["bare"]), 3)
    out["ratio_vs_bare_isolated"] = round(sandboxed / statistics.fmean(times["bare_isolated"]), 3)
    return out


def concurrent(runs: int, workers: int, rounds: int = 5) -> dict:
    """Throughput with `workers` at once, the three methods interleaved round by round."""
    problem = Problem(id="add", prompt="add", tests=TESTS, entry_point="add")
    per_round = max(workers, runs // rounds)
    totals = {"bare": 0.0, "bare_isolated": 0.0, "sandboxed": 0.0}
    with (
        RewardPool(RewardConfig(kind="sandbox", workers=workers, timeout_s=10)) as pool,
        ThreadPoolExecutor(workers) as ex,
    ):
        pool.score([problem] * workers, [CODE] * workers)  # warm
        for _ in range(rounds):
            start = time.perf_counter()
            results = pool.score([problem] * per_round, [CODE] * per_round)
            totals["sandboxed"] += time.perf_counter() - start
            assert all(r.status == "passed" for r in results)
            for name, flags in (("bare", []), ("bare_isolated", ["-I", "-S"])):
                start = time.perf_counter()
                list(ex.map(lambda _, f=flags: bare(f), range(per_round)))
                totals[name] += time.perf_counter() - start
    n = per_round * rounds
    out: dict = {"workers": workers, **{f"{k}_per_s": round(n / v, 1) for k, v in totals.items()}}
    out["ratio_vs_bare"] = round(totals["sandboxed"] / totals["bare"], 3)
    out["ratio_vs_bare_isolated"] = round(totals["sandboxed"] / totals["bare_isolated"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()
    if find_bwrap() is None:
        sys.exit("bubblewrap is not installed: sudo tools/setup_system.sh")
    report = {
        "python": sys.version.split()[0],
        "cpus": default_workers(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "sequential": sequential(args.runs),
        "concurrent": concurrent(args.runs, args.workers),
        "target_ratio": 1.3,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
