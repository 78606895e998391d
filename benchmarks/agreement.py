"""The engine-vs-trainer agreement: its clean floor per dtype pair, every injected conversion fault's gap,
and what the probe costs. Prints JSON.

    python benchmarks/agreement.py [--paths dense,hf,moe,separated] [--engine-dtypes fp32,bf16]
                                   [--repeats 1] [--cost-steps 12] [--overrides "k=v ..."] [--keep DIR]

For each path (`dense` = grpo_tiny_cpu, `hf` = grpo_tiny_hf_cpu on the HF-format fixture, `moe` =
grpo_tiny_moe_cpu, `separated` = grpo_tiny_cpu_separated) and engine dtype (the trainers are fp32), one
real `launch_local` run publishes a clean version 1, then one faulty version per fault of
reshard/faults.py (MEGATRON_RL_PUBLICATION_FAULTS), then clean ones again, with
`rollout.on_logprob_disagreement=warn`: every version serves and the probe of every publication is
recorded (loop/placement/probe.py). Per run:
  clean     the largest probe max and mean |trainer - engine| over the clean versions, and the step's own
            agreement (old log-probs against the engines', the batch that version drew)
  faults    each fault's probe max and mean gap, and whether the thresholds in force catch it
  margin    the smallest fault gap / the threshold, and the threshold / the clean floor (both > 1:
            every fault caught and no clean version flagged)
The thresholds are the recipe's (rollout/agreement.py FLOORS x margin), printed with the run.
`--overrides` go after the benchmark's own on every fault run (tests/integration/loop/
test_agreement_faults.py runs these runs with the refusal policy raised, and keeps them: `--keep`).

`--cost-steps N`: the probe's cost, side by side: the dense path, N steps with the probe and N without
(`rollout.logprob_probe_prompts=0`), alternated `--repeats` times; the median step wall seconds of each
after the first two, and the probe phase's share.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from megatron_rl.reshard.faults import DENSE, ENV, MOE  # noqa: E402

RECIPES = {
    "dense": "grpo_tiny_cpu",
    "hf": "grpo_tiny_hf_cpu",
    "moe": "grpo_tiny_moe_cpu",
    "separated": "grpo_tiny_cpu_separated",
}
FAST = [
    "data.prompts_per_step=4",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch_size=8",
    "algorithm.minibatches=2",
]
QUIET = ["logger.progress=false", "logger.wandb=false"]
CLEAN_AFTER = 2  # clean versions after the faulty ones


def run(out: Path, name: str, recipe: str, steps: int, overrides: list[str], faults: str = "") -> list[dict]:
    env = {**os.environ, "MEGATRON_RL_RUN_NAME": name, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop(ENV, None)
    if faults:
        env[ENV] = faults
    cmd = [
        sys.executable,
        "-m",
        "megatron_rl.cli.launch_local",
        recipe,
        f"steps={steps}",
        f"logger.run_dir={out / 'outputs'}",
        f"checkpoint.dir={out / 'ckpt'}",
        "checkpoint.interval=0",
        *QUIET,
        *overrides,
    ]
    log = out / f"{name}.log"
    with log.open("w") as f:
        rc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, timeout=1800
        ).returncode
    if rc != 0:
        raise SystemExit(f"{name} failed (rc={rc}):\n{log.read_text()[-4000:]}")
    lines = (out / "outputs" / name / "steps.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def faults_run(out: Path, path: str, engine_dtype: str, extra: list[str] | None = None) -> dict:
    faults = list(DENSE) + (list(MOE) if path == "moe" else [])
    plan = {v: f for v, f in enumerate(faults, start=2)}
    steps = 1 + len(faults) + CLEAN_AFTER
    overrides = [
        *([] if path == "hf" else FAST),
        *(["optim.micro_batch_size=4"] if path == "moe" else []),
        f"rollout.dtype={engine_dtype}",
        "rollout.on_logprob_disagreement=warn",
        *(extra or []),
    ]
    recs = run(
        out,
        f"{path}-{engine_dtype}",
        RECIPES[path],
        steps,
        overrides,
        ",".join(f"{f}@{v}" for v, f in plan.items()),
    )
    probes = {
        r["publication"]["probe"]["version"]: r["publication"]["probe"] for r in recs if r.get("publication")
    }
    clean = [v for v in probes if v not in plan]
    thresholds = {k: probes[clean[0]][k] for k in ("max_gap", "mean_gap")}
    floor = {
        "probe_max": max(probes[v]["max_abs_diff"] for v in clean),
        "probe_mean": max(probes[v]["mean_abs_diff"] for v in clean),
        "step_max": max(
            r["logprob_agreement"]["all_ranks"]["max_abs_diff"]
            for r in recs
            if r["version"] in clean and r["logprob_agreement"]["version_lag"] == 0
        ),
        "flagged": sorted(v for v in clean if not probes[v]["passed"]),
    }
    found = {}
    for v, fault in plan.items():
        p = probes[v]
        found[fault] = {
            "version": v,
            "max": p["max_abs_diff"],
            "mean": p["mean_abs_diff"],
            "caught": not p["passed"],
        }
    caught_by = [
        max(f["max"] / thresholds["max_gap"], f["mean"] / thresholds["mean_gap"]) for f in found.values()
    ]
    return {
        "recipe": RECIPES[path],
        "engine_dtype": engine_dtype,
        "thresholds": thresholds,
        "clean": floor,
        "faults": found,
        "margin": {
            "weakest_fault_over_threshold": min(caught_by),
            "threshold_over_clean_max": thresholds["max_gap"] / max(floor["probe_max"], 1e-12),
            "threshold_over_clean_mean": thresholds["mean_gap"] / max(floor["probe_mean"], 1e-12),
        },
        "probe_seconds_median": statistics.median(p["seconds"] for v, p in probes.items() if v > 1),
    }


def cost(out: Path, steps: int, repeats: int) -> dict:
    walls: dict[str, list[float]] = {"probe": [], "no_probe": []}
    shares = []
    for r in range(repeats):
        for mode in ("probe", "no_probe"):
            extra = ["rollout.logprob_probe_prompts=0"] if mode == "no_probe" else []
            recs = run(out, f"cost-{mode}-{r}", RECIPES["dense"], steps, extra)
            steady = [x for x in recs if x["step"] > 2 and "wall_seconds" in x]
            walls[mode] += [x["wall_seconds"] for x in steady]
            if mode == "probe":
                shares += [x["phases"]["probe"]["seconds"] / x["wall_seconds"] for x in steady]
    med = {m: statistics.median(w) for m, w in walls.items()}
    return {
        "recipe": RECIPES["dense"],
        "steps_per_run": steps,
        "repeats": repeats,
        "step_s_median": med,
        "probe_cost_share": (med["probe"] - med["no_probe"]) / med["no_probe"],
        "probe_phase_share_median": statistics.median(shares),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paths", default="dense,hf,moe,separated")
    p.add_argument("--engine-dtypes", default="fp32,bf16")
    p.add_argument("--cost-steps", type=int, default=12, help="0: skip the cost runs")
    p.add_argument("--repeats", type=int, default=1, help="cost runs of each mode")
    p.add_argument("--overrides", default="", help='extra overrides for the fault runs, e.g. "k=v k2=v2"')
    p.add_argument("--keep", type=Path, help="keep the runs' outputs here (default: a temporary directory)")
    args = p.parse_args()
    out = args.keep or Path(tempfile.mkdtemp(prefix="agreement-"))
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"runs": []}
    try:
        for path in filter(None, args.paths.split(",")):
            if path not in RECIPES:
                raise SystemExit(f"--paths: {path!r} is not one of {', '.join(RECIPES)}")
            for dtype in filter(None, args.engine_dtypes.split(",")):
                result["runs"].append(faults_run(out, path, dtype, shlex.split(args.overrides)))
        if args.cost_steps:
            result["cost"] = cost(out, args.cost_steps, args.repeats)
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
