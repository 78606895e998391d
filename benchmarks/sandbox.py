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
is <= 1.3).

With `--baseline DIR` (another checkout's root, or a folder holding its `megatron_rl`, e.g.
`git archive HEAD~1 megatron_rl | tar -x -C DIR`) that checkout's sandbox runs too, interleaved with
this one in the same blocks and rounds, so a change to the sandbox is measured against its predecessor
side by side rather than across sittings. Each side runs in a process of its own (this script with
`--serve`) with its checkout first on PYTHONPATH, so every module the sandbox imports is that
checkout's; the served side reports the `megatron_rl` it imported and is refused if it is not DIR's.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A served side (`--serve`) imports nothing of the checkout it measures but `megatron_rl.reward.sandbox`,
# and uses only what every version of it has had: Sandbox(limits, bwrap=), .start(), .run(code, tests,
# entry_point) -> {"status": ...}, .close(); SandboxLimits(timeout_s=); find_bwrap().
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


def serve(workers: int) -> None:
    """`--serve`: `workers` sandboxes of the checkout first on PYTHONPATH, driven over stdin and stdout
    (one JSON object a line each way): {"op": "one", "n": N} runs N jobs on the first sandbox and
    answers their seconds; {"op": "many", "n": N} runs N jobs on every sandbox at once, one thread
    each, and answers the wall seconds. The first line out names the `megatron_rl` imported."""
    import megatron_rl
    from megatron_rl.reward.sandbox import Sandbox, SandboxLimits, find_bwrap

    boxes = [Sandbox(SandboxLimits(timeout_s=10), bwrap=find_bwrap()) for _ in range(workers)]

    def job(box) -> None:
        record = box.run(CODE, TESTS, "add")
        if record["status"] != "passed":
            raise RuntimeError(f"the trivial program did not pass: {record}")

    def run_on(box, n: int) -> None:
        for _ in range(n):
            job(box)

    try:
        for box in boxes:
            box.start()
            run_on(box, 3)  # warm
        print(json.dumps({"megatron_rl": str(Path(megatron_rl.__file__).resolve().parent)}), flush=True)
        with ThreadPoolExecutor(workers) as ex:
            for line in sys.stdin:
                cmd = json.loads(line)
                if cmd["op"] == "one":
                    seconds = []
                    for _ in range(cmd["n"]):
                        start = time.perf_counter()
                        job(boxes[0])
                        seconds.append(time.perf_counter() - start)
                    answer: object = seconds
                else:
                    start = time.perf_counter()
                    list(ex.map(run_on, boxes, [cmd["n"]] * len(boxes)))
                    answer = time.perf_counter() - start
                print(json.dumps(answer), flush=True)
    finally:
        for box in boxes:
            box.close()


class Served:
    """One checkout's sandboxes in a `--serve` process with `root` first on PYTHONPATH."""

    def __init__(self, root: Path, workers: int):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", "--workers", str(workers)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        first = self.proc.stdout.readline()
        if not first:
            raise SystemExit(f"the sandbox of {root} did not start (exit code {self.proc.wait()})")
        imported = Path(json.loads(first)["megatron_rl"])
        if not imported.is_relative_to(root.resolve()):
            self.close()
            raise SystemExit(f"--baseline {root}: its process imported {imported}, not that checkout's")

    def ask(self, op: str, n: int):
        self.proc.stdin.write(json.dumps({"op": op, "n": n}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a sandbox process ended (exit code {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def versus_baseline(runs: int, workers: int, baseline: str, block: int = 10) -> dict:
    """This checkout's Sandbox against the baseline's, each served by a process of its own: one at a
    time, then `workers` threads at once, the two sides alternated block by block."""
    block = max(1, min(block, runs))
    base = Served(Path(baseline), workers)  # first: a baseline that imports another tree stops here
    try:
        sides = {"current": Served(REPO, workers), "baseline": base}
    except BaseException:
        base.close()
        raise
    one: dict[str, list[float]] = {tag: [] for tag in sides}
    many: dict[str, float] = {tag: 0.0 for tag in sides}
    try:
        for _ in range(0, runs, block):
            for tag, side in sides.items():
                one[tag] += side.ask("one", block)
                many[tag] += side.ask("many", block)
    finally:
        for side in sides.values():
            side.close()
    out: dict = {
        tag: {**summary(t), f"per_s_{workers}_workers": round(workers * len(t) / many[tag], 1)}
        for tag, t in one.items()
    }
    out["ratio_mean_ms"] = round(statistics.fmean(one["current"]) / statistics.fmean(one["baseline"]), 3)
    out["ratio_per_s"] = round(many["baseline"] / many["current"], 3)  # throughput: current over baseline
    return out


def sequential(runs: int, block: int = 10) -> dict:
    from megatron_rl.reward.sandbox import Sandbox, SandboxLimits, find_bwrap

    block = max(1, min(block, runs))
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
    from megatron_rl.config.schema import RewardConfig
    from megatron_rl.reward.pool import RewardPool
    from megatron_rl.reward.problem import Problem

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0, help="default: one per CPU")
    parser.add_argument(
        "--baseline",
        help="another checkout's root (or a folder holding its megatron_rl), measured side by side",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.workers)
    # This checkout's sandbox, whichever megatron_rl an installed package would point at.
    sys.path.insert(0, str(REPO))
    from megatron_rl.reward.sandbox import default_workers, find_bwrap

    args.workers = args.workers or default_workers()
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
