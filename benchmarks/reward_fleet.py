"""The reward fleet on this machine's loopback: scaling with servers, the remote path's overhead, a lost
server. Prints JSON.

    python benchmarks/reward_fleet.py [--samples 400] [--latency-s 0.05] [--workers 2] [--repeats 3]
                                      [--overhead-samples 300]

Real `megatron-rl reward-server` processes on 127.0.0.1 scoring with the fixed-latency verifier
(`megatron_rl.reward.verifiers:fixed_latency`: math_answer after `--latency-s` of sleep, so a server's
throughput is set by its workers and the latency, not by this machine's 2 cores, which two servers of
real sandboxes would share), and the job's side as training runs it: a `RewardPool` with
`reward.endpoints`.
  throughput   samples per second through 1 server and through 2 (`--workers` each), `--samples` at
               once, best of `--repeats`; `scaling` = 2 servers / 1 (a fleet that adds servers
               should be near 2)
  overhead     the same samples one at a time (each waits for its result) with a zero-latency verifier,
               through one server against the local pool in this process: `overhead_ms_per_sample` =
               the difference per sample (HTTP, JSON, the server's own pool hop), medians of `--repeats`
  lost_server  two servers, one killed with SIGKILL after a quarter of the results: every sample's
               result comes back exactly once, the retries counted (`remote_retries`), the survivor's
               share, and the wall seconds
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron_rl.config.schema import RewardConfig  # noqa: E402
from megatron_rl.reward.pool import RewardPool  # noqa: E402
from megatron_rl.reward.problem import Problem  # noqa: E402
from megatron_rl.reward.server import TOKEN_ENV, launch_here  # noqa: E402

VERIFIER = "megatron_rl.reward.verifiers:fixed_latency"
TOKEN = os.environ.get(TOKEN_ENV) or os.urandom(16).hex()


def problems(n: int) -> tuple[list[Problem], list[str]]:
    return [Problem(id=f"m{i}", prompt=f"{i}+1?", answer=str(i + 1)) for i in range(n)], [
        f"\\boxed{{{i + 1}}}" for i in range(n)
    ]


def servers(tmp: Path, count: int, workers: int, latency_s: float):
    env = {
        **os.environ,
        TOKEN_ENV: TOKEN,
        "MEGATRON_RL_VERIFIER_LATENCY_S": str(latency_s),
        "PYTHONPATH": str(REPO),
    }
    args = ["--function", VERIFIER, "--workers", str(workers), "--queue", str(4 * workers)]
    return [launch_here(args, env, tmp / f"server{len(list(tmp.glob('*.log')))}.log") for _ in range(count)]


def stop(procs) -> None:
    for p, _ in procs:
        if p.poll() is None:
            p.terminate()
    for p, _ in procs:
        p.wait(10)


def config(addresses) -> RewardConfig:
    return RewardConfig(
        kind="function", function=VERIFIER, endpoints=[a for _, a in addresses], remote_timeout_s=30
    )


def throughput(addresses, n: int) -> float:
    ps, texts = problems(n)
    with RewardPool(config(addresses)) as pool:
        pool.score(ps[:8], texts[:8])  # connections open
        start = time.perf_counter()
        results = pool.score(ps, texts)
        seconds = time.perf_counter() - start
    assert all(r.reward == 1.0 for r in results), [r for r in results if r.reward != 1.0][:2]
    return n / seconds


def one_at_a_time(pool, n: int) -> float:
    ps, texts = problems(n)
    pool.score(ps[:4], texts[:4])
    start = time.perf_counter()
    for p, t in zip(ps, texts):
        (r,) = pool.score([p], [t])
        assert r.reward == 1.0, r
    return (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--latency-s", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=2, help="workers per server")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--overhead-samples", type=int, default=300)
    args = ap.parse_args(argv)
    os.environ[TOKEN_ENV] = TOKEN
    out: dict = {"samples": args.samples, "latency_s": args.latency_s, "workers_per_server": args.workers}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fleet = servers(tmp, 2, args.workers, args.latency_s)
        try:
            one = max(throughput(fleet[:1], args.samples) for _ in range(args.repeats))
            two = max(throughput(fleet, args.samples) for _ in range(args.repeats))
        finally:
            stop(fleet)
        out["throughput"] = {
            "one_server_per_s": round(one, 1),
            "two_servers_per_s": round(two, 1),
            "ideal_one_server_per_s": round(args.workers / args.latency_s, 1),
            "scaling": round(two / one, 3),
        }
        print(f"[reward_fleet] throughput: {out['throughput']}", file=sys.stderr)

        fleet = servers(tmp, 1, 1, 0.0)
        os.environ["MEGATRON_RL_VERIFIER_LATENCY_S"] = "0"
        remote, local = [], []
        try:
            with (
                RewardPool(config(fleet)) as rp,
                RewardPool(RewardConfig(kind="function", function=VERIFIER, workers=1)) as lp,
            ):
                for _ in range(args.repeats):
                    remote.append(one_at_a_time(rp, args.overhead_samples))
                    local.append(one_at_a_time(lp, args.overhead_samples))
        finally:
            stop(fleet)
        r_ms, l_ms = statistics.median(remote) * 1e3, statistics.median(local) * 1e3
        out["overhead"] = {
            "remote_ms_per_sample": round(r_ms, 3),
            "local_ms_per_sample": round(l_ms, 3),
            "overhead_ms_per_sample": round(r_ms - l_ms, 3),
        }
        print(f"[reward_fleet] overhead: {out['overhead']}", file=sys.stderr)

        os.environ["MEGATRON_RL_VERIFIER_LATENCY_S"] = str(args.latency_s)
        fleet = servers(tmp, 2, args.workers, args.latency_s)
        n = args.samples
        ps, texts = problems(n)
        got: list = []
        start = time.perf_counter()
        try:
            with RewardPool(config(fleet)) as pool:
                for i, (p, t) in enumerate(zip(ps, texts)):
                    pool.submit(i, p, t)
                for r in pool.results(n, timeout=600):
                    got.append(r)
                    if len(got) == n // 4:
                        os.kill(fleet[0][0].pid, signal.SIGKILL)
                retries = pool.take_retries()
            import requests

            survivor = requests.get(f"http://{fleet[1][1]}/health", timeout=10).json()["scored"]
        finally:
            stop(fleet)
        ids = [r.sample_id for r in got]
        out["lost_server"] = {
            "samples": n,
            "results": len(got),
            "each_scored_once": sorted(ids) == list(range(n)),
            "all_correct": all(r.reward == 1.0 for r in got),
            "remote_retries": retries,
            "survivor_scored": survivor,
            "wall_s": round(time.perf_counter() - start, 2),
        }
        print(f"[reward_fleet] lost server: {out['lost_server']}", file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
