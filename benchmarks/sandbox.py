"""Executions per second of a trivial passing program: sandboxed vs a bare `python -c` subprocess.

    python benchmarks/sandbox.py [--runs 200] [--workers N] [--baseline DIR]

Three ways to run the same program and its test, in one process, interleaved in small blocks so
that background load hits all of them alike:
- bare:           `python -c "<program + tests>"` with this interpreter, as a user would run it
                  (site-packages imported: the cost a venv's .pth files add is part of it);
- bare_isolated:  `python -I -S -c ...`, the cheapest interpreter start there is (no site);
- sandboxed:      `Sandbox.run` (bubblewrap, per-job namespaces, the verdict split of harness.py).
Then the same at pool scale: `--workers` concurrent bare subprocesses vs a RewardPool of that size.
Prints one JSON object; `ratio_*` is sandboxed seconds per execution over the baseline's (the target
is <= 1.3). With `--baseline DIR` (another checkout, e.g. `git archive HEAD~1 megatron_rl | tar -x -C DIR`)
its sandbox runs too, interleaved with this one in the same blocks and rounds, so a change to the
sandbox is measured against its predecessor side by side rather than across sittings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from megatron_rl.config.schema import RewardConfig
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
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


def load_sandbox_module(root: str, tag: str):
    """Another checkout's `megatron_rl/reward/sandbox.py`, loaded under its own name (its runtime files
    are read from that checkout when its sandbox starts)."""
    spec = importlib.util.spec_from_file_location(f"sandbox_{tag}", f"{root}/megatron_rl/reward/sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def versus_baseline(runs: int, workers: int, baseline: str, block: int = 10) -> dict:
    """This checkout's Sandbox against the baseline's: one at a time, then `workers` threads at once."""
    current = sys.modules[Sandbox.__module__]
    modules = {"current": current, "baseline": load_sandbox_module(baseline, "baseline")}
    boxes = {}
    for tag, mod in modules.items():
        boxes[tag] = [
            mod.Sandbox(mod.SandboxLimits(timeout_s=10), bwrap=find_bwrap()) for _ in range(workers)
        ]
        for box in boxes[tag]:
            box.start()
            for _ in range(3):
                assert box.run(CODE, TESTS, "add")["status"] == "passed"
    one: dict[str, list[float]] = {tag: [] for tag in boxes}
    many: dict[str, float] = {tag: 0.0 for tag in boxes}

    def run_on(box) -> None:
        for _ in range(block):
            assert box.run(CODE, TESTS, "add")["status"] == "passed"

    with ThreadPoolExecutor(workers) as ex:
        for _ in range(0, runs, block):
            for tag, group in boxes.items():
                for _ in range(block):
                    start = time.perf_counter()
                    assert group[0].run(CODE, TESTS, "add")["status"] == "passed"
                    one[tag].append(time.perf_counter() - start)
                start = time.perf_counter()
                list(ex.map(run_on, group))
                many[tag] += time.perf_counter() - start
    for group in boxes.values():
        for box in group:
            box.close()
    out: dict = {
        tag: {**summary(t), f"per_s_{workers}_workers": round(workers * len(t) / many[tag], 1)}
        for tag, t in one.items()
    }
    out["ratio_mean_ms"] = round(statistics.fmean(one["current"]) / statistics.fmean(one["baseline"]), 3)
    out["ratio_per_s"] = round(many["baseline"] / many["current"], 3)  # throughput: current over baseline
    return out


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
    parser.add_argument("--baseline", help="another checkout's root, measured side by side with this one")
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
    if args.baseline:
        report["versus_baseline"] = versus_baseline(args.runs, args.workers, args.baseline)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
