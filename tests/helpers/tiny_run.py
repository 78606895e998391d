"""Run the tiny recipe for a few steps from a test and read its step records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.launch import REPO

# Small and fast: 4 prompts x 4 samples, 2 minibatches.
FAST = [
    "data.prompts_per_step=4",
    "rollout.samples_per_prompt=4",
    "algorithm.minibatches=2",
    "optim.micro_batch_size=8",
    "logger.progress=false",
]

# The session's shared runs (tests/integration/loop/conftest.py). `tiny`: KL on, one minibatch, the
# progress bar and W&B on (its old log-probs recomputed; test_old_logprobs's `auto` run takes the same
# settings, so the two draw the same samples). Not under the device guard, as the console test's run
# never was: that test reads the first step's engine warm-up off the generation timings.
TINY_STEPS = 3
TINY = ["algorithm.kl_coef=0.04", "algorithm.minibatches=1", "logger.progress=true"]
# `engine`: under the device guard, the engines' log-probs as the old ones at two minibatches, dynamic
# sampling.
ENGINE_STEPS = 3
ENGINE_ENV = {"MEGATRON_RL_DEVICE_GUARD": "1"}
ENGINE = [
    "algorithm.minibatches=2",
    "algorithm.old_logprobs=engine",
    "algorithm.kl_coef=0.04",
    "algorithm.dynamic_sampling=true",
    "logger.wandb=false",
]
# `verbose`: rollout.oversample=1.5, no KL (no reference phase), MEGATRON_RL_VERBOSE=1, no W&B.
VERBOSE_STEPS = 2
VERBOSE = ["algorithm.kl_coef=0", "rollout.oversample=1.5", "logger.wandb=false"]
VERBOSE_ENV = {"MEGATRON_RL_VERBOSE": "1"}
# The kill-and-resume tests' runs (tests/integration/checkpoint/conftest.py: their uninterrupted run `A`,
# shared): 4 steps, a checkpoint (asynchronous) after every step, W&B on (offline): a resumed run continues
# its W&B run, another run's checkpoint starts one of its own (test_resume.py).
RESUME_STEPS = 4
SAVE_EVERY_STEP = [
    "checkpoint.interval=1",
    "checkpoint.keep_last=5",
    "checkpoint.async_save=true",
]


def launch(
    tmp: Path,
    steps: int,
    extra: list[str] | None = None,
    name: str = "run",
    wait: bool = True,
    timeout: float = 900,
    env: dict | None = None,
    recipe: str = "grpo_tiny_cpu",
):
    """Start `python -m megatron_rl.cli.launch_local <recipe>` (grpo_tiny_cpu) with outputs under tmp.

    The launcher's terminal output (stdout and stderr) goes to tmp/<name>.log."""
    overrides = [
        f"steps={steps}",
        f"logger.run_dir={tmp / 'outputs'}",
        f"checkpoint.dir={tmp / 'ckpt'}",
        *FAST,
        *(extra or []),
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
        "MEGATRON_RL_RUN_NAME": name,
        "PYTHONPATH": str(REPO),
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "megatron_rl.cli.launch_local", recipe, *overrides]
    log = (tmp / f"{name}.log").open("a")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
    )
    if wait:
        rc = proc.wait(timeout=timeout)
        if rc != 0:
            raise AssertionError(f"tiny run failed rc={rc}:\n{(tmp / f'{name}.log').read_text()[-6000:]}")
    return proc


def kill_run(proc: subprocess.Popen) -> int:
    """SIGKILL a launched run and every process under it, at once, as a node failure would.

    Killing the launcher's process group is not enough: torchrun starts each rank in a session of
    its own, so the ranks (and their checkpoint writers and reward workers) would run on, orphaned.
    Returns how many processes were killed."""
    import signal

    import psutil

    try:
        tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        tree = []
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    return len(tree)


def records(tmp: Path, name: str = "run") -> list[dict]:
    path = tmp / "outputs" / name / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_alarm(recs: list[dict]) -> None:
    """A clean run: every publication activated after its log-prob probe passed (loop/placement/probe.py), and no
    step's own agreement disagreed (fp32 engine and trainer agree to rounding)."""
    for r in recs:
        pub = r["publication"]
        if pub is None:  # asynchronous: the last steps publish nothing
            continue
        assert pub["activated"] and pub["probe"] is not None and pub["probe"]["passed"], (r["step"], pub)
        assert r["logprob_agreement"]["problems"] == [], (r["step"], r["logprob_agreement"])
