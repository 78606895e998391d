"""Peer benchmark: TRL's GRPOTrainer against this project on the same GRPO workload. Prints JSON.

    pip install --no-deps trl==1.16.0 accelerate==1.15.0   # the `peer` extra's pins; the rest is in the lock
    python benchmarks/peer_trl.py [--tokens 32 64] [--prompts 16] [--steps 8] [--warmup 2] [--repeats 2]
                                  [--ours auto recompute] [--ours-overrides "k=v ..."] [--fixture DIR]
                                  [--without-trl]

The workload: the tiny random Qwen2 HF checkpoint of `models/fixture.py` (460k params,
fp32), 16 prompts x 8 samples per step from the bundled problems (the same prompts in the same order:
drawn by `ProblemTask` with data.seed, rendered by the checkpoint's chat template on both sides),
temperature 1, top_p 1, no top_k, completions of at most `--tokens` tokens that stop at the
checkpoint's end ids on both sides (the same set: generation_config.json's and the tokenizer's eos),
k3 KL to a frozen reference with coefficient 0.04 as a loss term, clip 0.2 / 0.28, token-mean loss,
group-std advantages, one AdamW step per batch (beta2 0.95, clip-norm 1.0, constant LR, no warm-up),
the in-process reward `megatron_rl.reward.verifiers:python_format`.

Each token length alternates the sides in one run: for every repeat, TRL, then each `--ours` variant
(`algorithm.old_logprobs=<variant>`; `default` adds no override), each a fresh process running
`--steps` steps (`--without-trl`: our side alone, TRL not needed). A side's median is over every step after the first `--warmup` of every repeat; a
step's time is wall clock (TRL: between `on_step_end` callbacks; ours: between the ends of the last
phase span of consecutive steps, from spans.jsonl, so logging and reductions count). Start-up is from
process start to the end of the first step. `ratio_<variant>` = ours median / TRL median (< 1: ours is
faster).

Deliberate differences, each side as it ships:
  - ours: the layout the planner's search ranks first for this workload on this machine (2 processes
    with OMP_NUM_THREADS=1 each, colocated vLLM engines; `--layout recipe`: the recipe's TP2);
    TRL: one process, transformers `generate`, torch.set_num_threads(2).
  - ours recomputes or reuses old log-probs per `--ours`; TRL with num_iterations=1 takes the
    current policy's detached log-probs (no extra forward).
  - ours checks engine/trainer log-prob agreement every step and validates each weight publication
    before the engines serve it; ours trains in microbatches of 16 (the recipe's), grouped by length
    and each padded to its own longest; TRL trains the 128 sequences in one batch padded to the
    longest prompt plus the longest completion.
  - completion lengths are not forced: random weights stop early at an end id some of the time on both
    sides, so each side's `completion_tokens_mean` and `stop_fraction` are reported from its own logs.
  - on random weights python_format pays 0 everywhere, so advantages are 0 and neither side's weights
    move: the work per step is the same, learning is not compared.
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

SAMPLES, KL_COEF, LR = 8, 0.04, 1.0e-4
REWARD = "megatron_rl.reward.verifiers:python_format"
RECIPE = "grpo_tiny_hf_cpu"
MAX_PROMPT_TOKENS = 320  # the recipe's data.max_prompt_tokens
DATA_SEED = 0
REPO = Path(__file__).resolve().parent.parent
INSTALL = "pip install --no-deps trl==1.16.0 accelerate==1.15.0"  # the `peer` extra's pins


def log(msg: str) -> None:
    print(f"[peer_trl] {msg}", file=sys.stderr, flush=True)


# ---- pure summaries (tested in tests/unit/test_peer_benchmark.py) ----------------------------------


def ours_step_walls(records: list[dict], spans: list[dict]) -> list[float]:
    """Wall seconds of each step: between the ends of the last phase span of consecutive steps (the
    first step from its first span's start). Without spans, the record's summed phase seconds."""
    ends, starts = {}, {}
    for line in spans:
        flat = [s for rank in line["spans_by_rank"] for s in rank]
        if flat:
            ends[line["step"]] = max(s[2] for s in flat)
            starts[line["step"]] = min(s[1] for s in flat)
    walls, prev = [], None
    for r in records:
        step = r["step"]
        if step in ends:
            walls.append(ends[step] - (prev if prev is not None else starts[step]))
            prev = ends[step]
        else:
            walls.append(r["step_seconds"])
            prev = None
    return walls


def summarize_side(runs: list[dict], warmup: int) -> dict:
    """One side over its repeats. Each run: step_seconds (per step), startup_s, completion_tokens
    (per step means), reward (per step means), stop_fraction (share ended at an end id) and, for ours, phases (per step {phase: seconds})."""
    kept = [r["step_seconds"][warmup:] for r in runs]
    pooled = [s for k in kept for s in k]
    out = {
        "median_step_s": _r(statistics.median(pooled)) if pooled else None,
        "run_medians_s": [_r(statistics.median(k)) if k else None for k in kept],
        "steps_kept": len(pooled),
        "startup_s": [_r(r["startup_s"]) for r in runs],
        "completion_tokens_mean": _r(
            _mean([t for r in runs for t in r["completion_tokens"] if t is not None])
        ),
        "reward_mean": _r(_mean([x for r in runs for x in r["reward"]])),
        "stop_fraction": _r(_mean([x for r in runs for x in r.get("stop_fraction", []) if x is not None])),
    }
    if any("phases" in r for r in runs):
        per_phase: dict[str, list[float]] = {}
        for r in runs:
            for step in r.get("phases", [])[warmup:]:
                for name, sec in step.items():
                    per_phase.setdefault(name, []).append(sec)
        out["phase_medians_s"] = {k: _r(statistics.median(v)) for k, v in per_phase.items()}
        # wall minus the timed phases: logging, reductions, anything between phases
        other = [
            wall - sum(step.values())
            for r in runs
            for wall, step in list(zip(r["step_seconds"], r.get("phases", [])))[warmup:]
        ]
        if other:
            out["phase_medians_s"]["untimed"] = _r(statistics.median(other))
    return out


def assemble(sides: dict[str, list[dict]], warmup: int, errors: dict[str, str] | None = None) -> dict:
    """{"trl": {...}, "ours_<v>": {...}, "ratio_<v>": ours median / TRL median} for one token length;
    a side whose process failed carries its `error` (and no ratio)."""
    errors = errors or {}
    out = {name: summarize_side(runs, warmup) if runs else {} for name, runs in sides.items()}
    for name, error in errors.items():
        out.setdefault(name, {})["error"] = error
    trl = out.get("trl", {}).get("median_step_s")
    for name in list(out):
        if name.startswith("ours_"):
            ours = out[name].get("median_step_s")
            out["ratio_" + name[len("ours_") :]] = _r(ours / trl) if ours and trl else None
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


# ---- prompts --------------------------------------------------------------------------------------


def draw_problems(fixture: Path, n: int) -> list:
    """The problems our driver draws for its first n prompts (ProblemTask, data.seed, bundled)."""
    from transformers import AutoTokenizer

    from megatron_rl.data.problems import load_problems
    from megatron_rl.data.task import ProblemTask

    tok = AutoTokenizer.from_pretrained(fixture)
    task = ProblemTask(load_problems("bundled"), tok, seed=DATA_SEED, max_prompt_tokens=MAX_PROMPT_TOKENS)
    return [p.problem for p in task.draw(n)]


# ---- TRL side (run in its own process: `--trl-child OUT`) ------------------------------------------


def trl_child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.trl_threads)
    try:
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise SystemExit(f"TRL is not installed ({e}): {INSTALL}") from None

    from megatron_rl.reward.verifiers import python_format

    fixture, tokens = Path(args.fixture), args.tokens[0]
    problems = draw_problems(fixture, args.prompts * args.steps)
    rows = [
        {"prompt": [{"role": "user", "content": p.prompt}], "problem_index": i}
        for i, p in enumerate(problems)
    ]

    def reward(prompts, completions, problem_index, **_):
        # conversational data: each completion is [{"role": "assistant", "content": text}]
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(python_format(problems[i], t)) for i, t in zip(problem_index, texts)]

    reward.__name__ = "python_format"
    step_ends: list[float] = []
    history: list[dict] = []  # TRL's logged metrics, one entry per step

    class Clock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            step_ends.append(time.time())

        def on_step_end(self, a, state, control, **kw):
            step_ends.append(time.time())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                history.append(dict(logs))

    out_dir = tempfile.mkdtemp(prefix="peer-trl-out-")
    try:
        config = GRPOConfig(
            output_dir=out_dir,
            max_steps=args.steps,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_epsilon=1e-8,
            max_grad_norm=1.0,
            per_device_train_batch_size=args.prompts * SAMPLES,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            num_generations=SAMPLES,
            max_completion_length=tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=KL_COEF,
            epsilon=0.2,
            epsilon_high=0.28,
            loss_type="dapo",  # token-mean over the batch's active tokens, as ours
            scale_rewards="group",
            shuffle_dataset=False,  # our draw order (the dataset rows are already in it)
            use_vllm=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            model_init_kwargs={"dtype": "float32"},
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            seed=1234,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=str(fixture),
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(fixture),
            callbacks=[Clock()],
        )
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    walls = [b - a for a, b in zip(step_ends, step_ends[1:])]
    result = {
        "step_ends": step_ends[1:],
        "step_seconds": walls,
        "completion_tokens": [x.get("completions/mean_length") for x in history],
        "reward": [x.get("reward") for x in history],
        "stop_fraction": [
            1.0 - x["completions/clipped_ratio"] for x in history if "completions/clipped_ratio" in x
        ],
        "threads": torch.get_num_threads(),
    }
    Path(args.trl_child).write_text(json.dumps(result))


def run_trl(args, fixture: Path, tokens: int, work: Path) -> dict:
    out = work / f"trl-{tokens}-{time.time_ns()}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(out), "--fixture", str(fixture)]
    cmd += ["--tokens", str(tokens), "--steps", str(args.steps), "--lr", str(args.lr)]
    cmd += ["--trl-threads", str(args.trl_threads), "--prompts", str(args.prompts)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.trl_threads), "WANDB_MODE": "disabled"}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.time()
    _call(cmd, env, work / f"trl-{tokens}.log")
    res = json.loads(out.read_text())
    res["startup_s"] = res["step_ends"][0] - t0
    return res


# ---- our side -------------------------------------------------------------------------------------


def ours_overrides(args, fixture: Path, tokens: int, variant: str, work: Path) -> list[str]:
    o = [
        f"model.hf_checkpoint={fixture}",
        f"steps={args.steps}",
        f"data.prompts_per_step={args.prompts}",
        f"data.seed={DATA_SEED}",
        f"rollout.samples_per_prompt={SAMPLES}",
        f"rollout.max_new_tokens={tokens}",
        f"rollout.mean_completion_tokens={tokens}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        f"algorithm.kl_coef={KL_COEF}",
        "algorithm.kl_estimator=k3",
        "algorithm.kl_in_reward=false",
        "algorithm.clip_low=0.2",
        "algorithm.clip_high=0.28",
        "algorithm.loss_agg=token-mean",
        "algorithm.advantage_std_norm=true",
        "algorithm.minibatches=1",
        "reward.kind=function",
        f"reward.function={REWARD}",
        "reward.seconds_per_sample=0.001",  # the planner's figure for this in-process reward
        "checkpoint.interval=0",
        "checkpoint.resume=none",
        f"checkpoint.dir={work / 'checkpoints'}",
        "logger.wandb=false",
        "logger.progress=false",
        f"logger.run_dir={work / 'runs'}",
        "optim.warmup_steps=0",
        f"optim.lr={args.lr}",
        "optim.lr_schedule=constant",
        "optim.weight_decay=0.0",
        "optim.adam_beta2=0.95",
        "optim.clip_grad=1.0",
    ]
    if variant != "default":
        o.append(f"algorithm.old_logprobs={variant}")
    return o + args.layout_overrides + shlex.split(args.ours_overrides)


def planner_layout(args, fixture: Path, tokens: int, work: Path) -> tuple[list[str], str]:
    """The layout `megatron-rl plan`'s search ranks first for this workload on this machine's cluster
    (conf/cluster/cpu_2core.yaml) among those the driver runs today, as overrides."""
    from megatron_rl.check.recipe import check_recipe, refused
    from megatron_rl.config.load import load_recipe
    from megatron_rl.plan.inputs import inputs_from_run
    from megatron_rl.plan.search import search
    from megatron_rl.run import resolve

    base = ours_overrides(args, fixture, tokens, "default", work)
    ranked = search(inputs_from_run(resolve(load_recipe(RECIPE, base))))["ranked"]
    for cyc in ranked:
        layout = cyc.layout.as_overrides()
        if not refused(check_recipe(load_recipe(RECIPE, base + layout), read_data=False), "run"):
            return layout, cyc.layout.describe()
    raise SystemExit("the planner's search found no layout the driver runs for this workload")


def run_ours(args, fixture: Path, tokens: int, variant: str, work: Path) -> dict:
    name = f"peer-{variant}-{tokens}-{time.time_ns()}"
    cmd = [sys.executable, "-m", "megatron_rl.cli.launch_local", RECIPE]
    cmd += ours_overrides(args, fixture, tokens, variant, work)
    env = {**os.environ, "MEGATRON_RL_RUN_NAME": name, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    _call(cmd, env, work / f"{name}.log")
    run_dir = work / "runs" / name
    records = _jsonl(run_dir / "steps.jsonl")
    spans = _jsonl(run_dir / "spans.jsonl")
    if len(records) < args.steps:
        raise RunFailed(f"wrote {len(records)} of {args.steps} steps")
    first_end = max((s[2] for r in spans[:1] for rank in r["spans_by_rank"] for s in rank), default=None)
    res = {
        "step_seconds": ours_step_walls(records, spans),
        "startup_s": (first_end - t0) if first_end else None,
        "completion_tokens": [r["completion_tokens_mean"] for r in records],
        "stop_fraction": [r.get("stop_fraction") for r in records],
        "reward": [r["reward"]["mean"] for r in records],
        "phases": [{k: v["seconds"] for k, v in r["phases"].items()} for r in records],
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return res


class RunFailed(RuntimeError):
    """A side's process failed: reported in the JSON (`error`) rather than ending the benchmark."""


def _jsonl(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def _call(cmd: list[str], env: dict, log_path: Path) -> None:
    with open(log_path, "w") as f:
        rc = subprocess.call(cmd, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise RunFailed(f"exit code {rc}; the last lines of {log_path.name}:\n{tail}")


# ---- main -----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step (x 8 samples)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped from each run's median")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--ours",
        nargs="+",
        default=["auto", "recompute"],
        help="algorithm.old_logprobs values; default = none",
    )
    ap.add_argument(
        "--ours-overrides", default="", help='extra overrides for every ours run, e.g. "layout.tp=1"'
    )
    ap.add_argument(
        "--fixture", default="", help="the tiny qwen2 checkpoint (built here when empty or missing)"
    )
    ap.add_argument(
        "--layout",
        choices=("planner", "recipe"),
        default="planner",
        help="ours: the layout the planner's search ranks first on this cluster (default), or the recipe's",
    )
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--trl-threads", type=int, default=2)
    ap.add_argument(
        "--without-trl", action="store_true", help="our side only (no TRL needed; no ratio is computed)"
    )
    ap.add_argument("--trl-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_child:
        return trl_child(args)
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    trl_version = None
    if not args.without_trl:
        try:
            import trl
        except ImportError:
            raise SystemExit(f"TRL is not installed: {INSTALL} (or --without-trl)") from None
        trl_version = trl.__version__

    from megatron_rl.models.fixture import build_fixture

    work = Path(tempfile.mkdtemp(prefix="peer-trl-"))
    try:
        fixture = Path(args.fixture) if args.fixture else work / "qwen2"
        build_fixture("qwen2", fixture)
        args.layout_overrides, layout = [], "the recipe's (layout.* of grpo_tiny_hf_cpu)"
        if args.layout == "planner":
            args.layout_overrides, layout = planner_layout(args, fixture, max(args.tokens), work)
        log(f"ours: {layout}")
        result: dict = {
            "workload": {
                "checkpoint": "models/fixture.py qwen2 (fp32)",
                "prompts_per_step": args.prompts,
                "samples_per_prompt": SAMPLES,
                "kl_coef": KL_COEF,
                "lr": args.lr,
                "reward": REWARD,
                "steps": args.steps,
                "warmup_steps_dropped": args.warmup,
                "repeats": args.repeats,
                "stop": "checkpoint end ids on both sides (lengths not forced)",
                "trl": f"trl {trl_version}, transformers generate, 1 process, torch threads {args.trl_threads}"
                if trl_version
                else None,
                "ours": f"{RECIPE} (launch_local), OMP_NUM_THREADS=1 per rank",
                "ours_overrides": args.ours_overrides,
                "ours_layout": layout,
            }
        }
        for tokens in args.tokens:
            variants = {**({} if args.without_trl else {"trl": None}), **{f"ours_{v}": v for v in args.ours}}
            sides: dict[str, list[dict]] = {name: [] for name in variants}
            errors: dict[str, str] = {}
            for rep in range(args.repeats):
                for name, variant in variants.items():
                    if name in errors:  # failed once: the other sides still run
                        continue
                    log(f"{tokens} tokens, repeat {rep + 1}/{args.repeats}: {name}")
                    try:
                        if variant is None:
                            sides[name].append(run_trl(args, fixture, tokens, work))
                        else:
                            sides[name].append(run_ours(args, fixture, tokens, variant, work))
                    except RunFailed as e:
                        errors[name] = str(e)
                        log(f"  {name} FAILED: {e}")
                        continue
                    log(f"  {name}: {_brief(sides[name][-1], args.warmup)}")
            result[f"tokens_{tokens}"] = assemble(sides, args.warmup, errors)
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _brief(run: dict, warmup: int) -> str:
    kept = run["step_seconds"][warmup:]
    med = statistics.median(kept) if kept else float("nan")
    return f"median step {med:.3f} s, start-up {run['startup_s'] or float('nan'):.1f} s"


if __name__ == "__main__":
    main()
