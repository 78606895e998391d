"""Separated pools, synchronous against asynchronous, on the tiny recipe. Prints JSON.

    python benchmarks/async.py [--steps 14] [--warmup 3] [--repeats 2] [--staleness 1]
                               [--overrides "k=v ..."] [--keep DIR]

`grpo_tiny_cpu_separated` (one trainer process, one engine process, one core each) runs with
`layout.synchrony=sync` and with `layout.synchrony=async rollout.max_staleness=k`, alternated in one
run (sync, async, sync, async, ...), each a fresh `launch_local` job of `--steps` steps. Per mode, over
every step after the first `--warmup` of every repeat:
  step_s               median wall seconds per step (the step record's `wall_seconds`: end of one
                       step's record to the next, so publication, gathers and logging count)
  process_s_per_step   step_s x the job's processes: what the run holds, busy or not
  trainer_wait_share   the trainer's seconds waiting on the engine's batch / step_s
  engine_busy_share    (generation + scoring) / step_s: the engine pool's busy share
  generation_tail_share  batch-slot seconds left empty while the batch waited on its longest
                       completion / generation seconds (the tail partial rollouts would cut)
  version_lag_max      the largest lag of any step (<= k asynchronous, 0 synchronous)
and `speedup` = sync step_s / async step_s. With `--oversample F`, a third mode runs sync with
`rollout.oversample=F`: its `generation_s` and `generation_tail_share` against sync's show what cutting
the groups that finish last saves (and `reward` what the bias toward short answers costs).

`--tail` adds the long-tailed task (`data.tail_share` of the prompts may answer in up to
`--tail-long` tokens, the others stop at `--tail-short`; no stop id, so every sample runs to its cap)
in four modes, alternated with the others: `tail_sync` (every group waits for the longest),
`tail_oversample` (rollout.oversample=`--tail-oversample`, the groups cut are dropped),
`tail_partial` (the same, cut groups carried and continued: rollout.partial) and `tail_async_partial`
(partial rollouts on asynchronous pools). Besides the figures above, per mode:
  completion_tokens_mean  mean length of the trained samples (dropping cut groups trains the short ones)
  tokens_from_earlier_batches  trained tokens drawn by an earlier batch (continued after a cut)
and `tail` compares each with tail_sync: mean generation seconds, idle (tail) share and step seconds,
as ratios (means: partial rollouts' cost comes in bursts, when a group cut max_cuts times must finish).

Then the planner: `megatron-rl plan grpo_tiny_cpu_separated --from-steps <a sync run's steps.jsonl>`
calibrates its phases on the synchronous run and predicts the asynchronous step of the same pools
(the overlapped cycle: publish + max(generation + scoring, trainer phases); plan/cycle.py).
`plan.error` = (predicted - measured async step_s) / measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = "grpo_tiny_cpu_separated"


def run_job(out: Path, name: str, steps: int, overrides: list[str]) -> tuple[list[dict], float]:
    """One launch_local job; its step records and its wall seconds."""
    env = {**os.environ, "MEGATRON_RL_RUN_NAME": name, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    cmd = [
        sys.executable, "-m", "megatron_rl.cli.launch_local", RECIPE, f"steps={steps}",
        f"logger.run_dir={out}", f"checkpoint.dir={out / 'ckpt'}", "logger.wandb=false",
        "logger.progress=false", "checkpoint.interval=0", *overrides,
    ]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    path = out / name / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()], seconds


def step_figures(rec: dict, processes: int) -> dict:
    wall = rec["wall_seconds"]
    ph = rec["phases"]
    gen, score = ph["generation"]["seconds"], ph["scoring"]["seconds"]
    return {
        "step_s": wall,
        "process_s_per_step": wall * processes,
        "trainer_wait_share": rec.get("rollout_wait_s", 0.0) / wall,
        "engine_busy_share": (gen + score) / wall,
        "generation_s": gen,
        # the trained batch's own tail over its own generate calls (asynchronous, the step's generation
        # phase is the engines' work on the next batch, drawn while this one trained)
        "generation_tail_share": _share(rec["generation"]["tail_s"], rec["generation"].get("seconds", gen)),
        "version_lag_max": rec["version_lag"]["max"],
        "reward": rec["reward"]["mean"],
        "completion_tokens_mean": rec.get("completion_tokens_mean", 0.0),
        "tokens_from_earlier_batches": rec["generation"].get("tokens_from_earlier_batches", 0),
    }


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def summarise(per_step: list[dict]) -> dict:
    out = {k: statistics.median(s[k] for s in per_step) for k in per_step[0] if k != "version_lag_max"}
    # Means too: a mode whose cost comes in bursts (partial rollouts wait for a group cut max_cuts times
    # every few steps) has a median step that hides them.
    for k in ("step_s", "generation_s", "generation_tail_share"):
        out[f"{k}_mean"] = statistics.fmean(s[k] for s in per_step)
    out["version_lag_max"] = max(s["version_lag_max"] for s in per_step)
    out["steps_measured"] = len(per_step)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def tail_modes(args) -> dict[str, list[str]]:
    """The long-tailed task's modes (module docstring), each a list of overrides."""
    task = [
        f"data.tail_share={args.tail_share}",
        f"data.short_answer_tokens={args.tail_short}",
        f"rollout.max_new_tokens={args.tail_long}",
        "rollout.stop_token_ids=[]",
    ]
    cut = [f"rollout.oversample={args.tail_oversample}"]
    return {
        "tail_sync": ["layout.synchrony=sync", *task],
        "tail_oversample": ["layout.synchrony=sync", *task, *cut],
        "tail_partial": ["layout.synchrony=sync", *task, *cut, "rollout.partial=true"],
        "tail_async_partial": ["layout.synchrony=async", *task, *cut, "rollout.partial=true"],
    }


def tail_comparison(modes: dict[str, dict]) -> dict:
    """Each tail mode against tail_sync: mean generation seconds, idle (tail) share and step seconds."""
    base = modes["tail_sync"]
    out = {}
    for name in ("tail_oversample", "tail_partial", "tail_async_partial"):
        m = modes[name]
        out[name] = {
            f"{k}_vs_sync": round(m[k] / base[k], 3) if base[k] else None
            for k in ("generation_s_mean", "generation_tail_share_mean", "step_s_mean")
        }
    return out


def planner_prediction(steps_jsonl: Path, overrides: list[str]) -> dict:
    """The planner, calibrated on a synchronous run, on the same pools run asynchronously."""
    cmd = [sys.executable, "-m", "megatron_rl.cli", "plan", RECIPE, *overrides, "--json", "--no-search"]
    cmd += ["--from-steps", str(steps_jsonl)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"plan failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    same_pools = [
        s
        for s in report["splits"]
        if s["placement"] == "separated" and s["trainer_gpus"] == report["layout"]["trainer_gpus"]
    ]
    by_mode = {s["synchrony"]: s for s in same_pools}
    return {
        "calibrated": report["calibrated"],
        "sync_step_s": round(by_mode["sync"]["step_s"], 4),
        "async_step_s": round(by_mode["async"]["step_s"], 4),
        "async_collection_s": round(by_mode["async"]["collection_s"], 4),
        "async_learning_s": round(by_mode["async"]["learning_s"], 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=3, help="steps of each job left out (start-up, first fill)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--staleness", type=int, default=1, help="rollout.max_staleness of the async runs")
    p.add_argument(
        "--overrides", default="", help='extra overrides for both modes, e.g. "data.prompts_per_step=16"'
    )
    p.add_argument(
        "--oversample",
        type=float,
        default=0.0,
        help="also run sync with rollout.oversample=F (draw F x prompts, keep the first groups to finish)",
    )
    p.add_argument("--tail", action="store_true", help="also run the long-tailed task's four modes")
    p.add_argument("--tail-share", type=float, default=0.125, help="share of prompts with long answers")
    p.add_argument("--tail-short", type=int, default=4, help="answer cap of the other prompts")
    p.add_argument("--tail-long", type=int, default=64, help="answer cap of the long prompts")
    p.add_argument("--tail-oversample", type=float, default=1.5, help="rollout.oversample of the cut modes")
    p.add_argument("--keep", type=Path, help="keep the runs' outputs here (default: a temporary directory)")
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    extra = shlex.split(args.overrides)
    modes = {
        "sync": ["layout.synchrony=sync"],
        "async": ["layout.synchrony=async", f"rollout.max_staleness={args.staleness}"],
    }
    if args.oversample > 0:
        modes["sync_oversample"] = ["layout.synchrony=sync", f"rollout.oversample={args.oversample}"]
    if args.tail:
        modes.update(tail_modes(args))
    out = args.keep or Path(tempfile.mkdtemp(prefix="async_bench_"))
    figures: dict[str, list[dict]] = {m: [] for m in modes}
    jobs: dict[str, list[float]] = {m: [] for m in modes}
    last_sync = None
    try:
        for r in range(args.repeats):
            for mode, over in modes.items():
                name = f"{mode}{r}"
                print(f"[async.py] repeat {r + 1}/{args.repeats}: {mode}", file=sys.stderr, flush=True)
                recs, seconds = run_job(out, name, args.steps, [*over, *extra])
                jobs[mode].append(round(seconds, 2))
                figures[mode] += [step_figures(rec, 2) for rec in recs[args.warmup :]]
                if mode == "sync":
                    last_sync = out / name / "steps.jsonl"
        result = {
            "recipe": RECIPE,
            "steps": args.steps,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "max_staleness": args.staleness,
            "overrides": extra,
            "modes": {m: summarise(figures[m]) for m in modes},
            "job_seconds": jobs,
        }
        if args.tail:
            result["tail"] = tail_comparison(result["modes"])
        sync_s, async_s = result["modes"]["sync"]["step_s"], result["modes"]["async"]["step_s"]
        result["speedup"] = round(sync_s / async_s, 3)
        plan = planner_prediction(last_sync, extra)
        plan["error"] = round((plan["async_step_s"] - async_s) / async_s, 3)
        result["plan"] = plan
        print(json.dumps(result, indent=1))
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
