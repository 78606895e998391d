"""Recovery from a lost rank, measured: kill -9 of one rank mid-step until the resumed run finishes the
step it was killed in.

    python benchmarks/recovery.py [--steps N] [--kill-after K] [--slurm | --spares] [--smoke]

The tiny recipe runs on this machine as `megatron-rl run` runs it (torchrun, 2 ranks, a checkpoint
after every step, asynchronous), named so that a rerun resumes. Once step K's record is written and
half a step more has passed, rank 1 alone gets SIGKILL (a node lost under one rank). Then the parts,
each from the wall clock of this process (step records are polled every 20 ms):
- `detection_s`: the kill until the launcher has noticed, stopped the other rank and exited;
- `requeue_s`: until the run starts again: on this machine the relaunch itself (`relaunch_s`, this
  script's own); with `--slurm`, also a real `scontrol requeue` of a running job on the local Slurm
  (tools/slurm_local.sh) until it runs again (`slurm_requeue_s`), the part a Slurm job pays;
- `startup_s`: the relaunch until the checkpoint starts loading (processes, process groups, model,
  engines, reward pool);
- `checkpoint_load_s`: the load, as the run reports it (`resumed from ... (loaded in X s)`);
- `rerun_s`: from the load until the killed step's record is written again: the steps redone
  (`lost_steps`: completed steps after the newest checkpoint on storage) and the killed step itself;
- `lost_work_s`: the work thrown away: the part of the killed step done before the kill, plus the
  redone steps at their first run's times.
`total_s` = detection + requeue + startup + load + rerun, with `requeue_s` the Slurm requeue when
measured (`requeue_source` says which). `megatron-rl plan --recovery FILE` plans failures with these
parts. Prints one JSON object. `--smoke`: 4 steps, killed after 2 (the suite's run).

`--spares`: the same kill in a Slurm job with a spare node (cluster.spare_nodes=1; the run on 2 one-GPU
nodes of a local Slurm's `sim` partition, one rank each), where slurm/train.sbatch leaves the killed
rank's node out and starts the run again on the spare as a new job step of the same job. The parts are
read from the job's log as this process sees its lines appear: `detection_s` until the script names the
failed rank, `requeue_s` until it starts the new step (the failover's decision: no queue wait), then
start-up, load and rerun as above.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.02
RESUMED = re.compile(r"resumed from (\S+) at step (\d+) \(loaded in ([0-9.]+) s\)")


def _command(tmp: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "megatron_rl.cli.launch_local",
        "grpo_tiny_cpu",
        f"steps={steps}",
        f"logger.run_dir={tmp / 'outputs'}",
        f"checkpoint.dir={tmp / 'ckpt'}",
        "checkpoint.interval=1",
        "checkpoint.async_save=true",
        "logger.progress=false",
        "logger.wandb=false",
    ]


def _launch(tmp: Path, steps: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MEGATRON_RL_RUN_NAME": "recovery", "PYTHONPATH": str(REPO)}
    out = log.open("a")
    return subprocess.Popen(_command(tmp, steps), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def _records(steps_file: Path) -> list[dict]:
    if not steps_file.exists():
        return []
    lines = steps_file.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def _wait(cond, proc: subprocess.Popen | None, what: str, timeout: float = 900.0, every: float = POLL_S):
    """Poll `cond` until it gives something true; a run (`proc`) that ends first, or the timeout, stops
    the benchmark naming what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"recovery: the run ended (exit {proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"recovery: no {what} after {timeout:.0f} s")
        time.sleep(every)


def _rank_pid(launcher: int, rank: int) -> int:
    """The PID of the process torchrun started as `rank` (its environment says RANK=rank)."""
    import psutil

    for child in psutil.Process(launcher).children(recursive=True):
        try:
            env = child.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if env.get("RANK") == str(rank) and "megatron_rl.train" in " ".join(child.cmdline()):
            return child.pid
    raise SystemExit(f"recovery: no process of rank {rank} under the launcher {launcher}")


def _mid_step_after(steps_file: Path, n: int, proc: subprocess.Popen | None, seen: dict[int, float]) -> float:
    """Wait for step `n`'s record, noting when each record appeared in `seen`, then half a step more (mid
    step n + 1); the mean step time (the warm-up step apart), which it returns."""

    def reached():
        recs = _records(steps_file)
        for r in recs:
            seen.setdefault(r["step"], time.monotonic())
        return recs if len(recs) >= n else None

    recs = _wait(reached, proc, f"step {n}'s record")
    step_s = [r["step_seconds"] for r in recs if r["step"] > 1] or [recs[-1]["step_seconds"]]
    mean_step = sum(step_s) / len(step_s)
    deadline = time.monotonic() + mean_step / 2
    while time.monotonic() < deadline:  # still noting records: the next step may end sooner
        reached()
        time.sleep(POLL_S)
    return mean_step


def _killed_in(steps_file: Path, steps: int) -> tuple[int, dict[int, dict]]:
    """The step the kill landed in: the one after the last recorded (a record needs every rank, so none
    is written after the kill), and the records before it. A step can end sooner than the half step waited
    (the first steps after warm-up are the slow ones): the kill then lands in the next, which is measured."""
    done_before = {r["step"]: r for r in _records(steps_file)}
    killed_in = max(done_before, default=0) + 1
    if killed_in > steps:
        raise SystemExit("recovery: the run ended before the kill landed; raise --steps")
    return killed_in, done_before


def measure(steps: int, kill_after: int, tmp: Path) -> dict:
    steps_file = tmp / "outputs" / "recovery" / "steps.jsonl"
    log = tmp / "recovery.log"
    first = _launch(tmp, steps, log)
    seen: dict[int, float] = {}  # step -> when its record appeared (this process's clock)
    mean_step = _mid_step_after(steps_file, kill_after, first, seen)
    victim = _rank_pid(first.pid, 1)
    t_kill = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    first.wait(timeout=600)
    t_exit = time.monotonic()
    killed_in, done_before = _killed_in(steps_file, steps)

    t_relaunch = time.monotonic()
    second = _launch(tmp, steps, log)
    relaunch_s = time.monotonic() - t_relaunch
    resumed = _wait(
        lambda: RESUMED.search(log.read_text()),
        second,
        "the resume line (no checkpoint was complete when the rank died? an asynchronous save is on "
        "storage once the next save starts: raise --kill-after)",
    )
    t_resumed = time.monotonic()
    at_step, load_s = int(resumed.group(2)), float(resumed.group(3))
    start = len(_records(steps_file))

    def again():
        recs = _records(steps_file)[start:]
        return next((r for r in recs if r["step"] == killed_in), None)

    _wait(again, second, f"step {killed_in}'s record after the resume")
    t_next = time.monotonic()
    second.wait(timeout=900)
    lost_steps = killed_in - 1 - at_step
    redone = [done_before[s]["step_seconds"] for s in range(at_step + 1, killed_in)]
    partial = t_kill - seen[killed_in - 1]
    # The resume line is seen when the load has ended; the load began load_s earlier.
    startup_s = max(t_resumed - load_s - t_relaunch, 0.0)
    parts = {
        "detection_s": t_exit - t_kill,
        "relaunch_s": relaunch_s,
        "startup_s": startup_s,
        "checkpoint_load_s": load_s,
        "rerun_s": t_next - t_resumed,
    }
    return {
        "recipe": "grpo_tiny_cpu",
        "ranks": 2,
        "steps": steps,
        "killed": {"rank": 1, "in_step": killed_in, "after_s_of_it": partial},
        "resumed_at_step": at_step,
        "lost_steps": lost_steps,
        "lost_work_s": partial + sum(redone),
        "step_s_mean": mean_step,
        **parts,
        "second_run_exit": second.returncode,
        "log": str(log),
    }


def slurm_requeue() -> dict:
    """`scontrol requeue` of a running job on a local Slurm of this script's own, until it runs again."""
    base = Path(tempfile.mkdtemp(prefix="recovery-slurm-"))
    env = _local_slurm(base)
    try:
        job = subprocess.run(
            ["sbatch", "--parsable", "--requeue", "--time=5", f"--output={base}/job.log", "--wrap", "sleep 300"],
            env=env, capture_output=True, text=True, check=True, cwd=base,
        ).stdout.strip().split(";")[0]  # fmt: skip

        def state() -> str:
            out = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True
            )
            return out.stdout.strip()

        _wait(lambda: state() == "RUNNING", None, "the job to run", 600, 0.1)
        t0 = time.monotonic()
        subprocess.run(["scontrol", "requeue", job], env=env, check=True, capture_output=True)
        _wait(lambda: state() not in ("RUNNING", ""), None, "the requeue to take", 600, 0.1)
        _wait(lambda: state() == "RUNNING", None, "the requeued job to run again", 600, 0.1)
        return {"slurm_requeue_s": time.monotonic() - t0}
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True) if "job" in locals() else None
        subprocess.run(["bash", str(REPO / "tools/slurm_local.sh"), "down"], env=env, capture_output=True)


def _local_slurm(base: Path, sim_nodes: int = 0) -> dict:
    """A local Slurm of this script's own (tools/slurm_local.sh) under `base`: its environment."""
    ports = [str(p) for p in _free_ports(3)]
    env = {
        **os.environ,
        "SLURM_BASE": str(base),
        "SLURMCTLD_PORT": ports[0],
        "SLURMD_PORT": ports[1],
        "FLEET_SLURMD_PORT": ports[2],
        "FLEET_NODES": "0",
        "SIM_NODES": str(sim_nodes),
        "RENDER_NODES": "0",
        "RENDER_CPU_NODES": "0",
    }
    up = subprocess.run(
        ["bash", str(REPO / "tools/slurm_local.sh"), "up"], env=env, capture_output=True, text=True
    )
    if up.returncode != 0:
        raise SystemExit(f"recovery: the local Slurm did not start:\n{up.stdout}\n{up.stderr}")
    env["SLURM_CONF"] = str(base / "etc" / "slurm.conf")
    return env


def measure_spares(steps: int, kill_after: int, tmp: Path) -> dict:
    """Kill -9 of rank 1 mid-step in a Slurm job with a spare node, until the killed step's record is
    written again by the run restarted on the spare (module docstring)."""
    env = _local_slurm(tmp / "slurm", sim_nodes=3)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHON=sys.executable, MEGATRON_RL_HOME=str(REPO))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    run = [*_command(tmp, steps)[4:], "layout.tp=1", "layout.dp=2", "optim.micro_batch_size=8"]
    run += ["cluster.nodes=2", "cluster.gpus_per_node=1", "cluster.spare_nodes=1", "cluster.partition=sim"]
    job = ""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "megatron_rl.cli", "submit", "grpo_tiny_cpu", *run, f"--log-dir={tmp}"],
            env=env, cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        job = re.search(r"submitted job (\d+)", out).group(1)
        log = tmp / f"grpo_tiny_cpu-{job}.log"
        steps_file = tmp / "outputs" / f"grpo_tiny_cpu-{job}" / "steps.jsonl"
        text = lambda: log.read_text() if log.exists() else ""  # noqa: E731
        seen: dict[int, float] = {}
        mean_step = _mid_step_after(steps_file, kill_after, None, seen)
        beat = json.loads((REPO / ".megatron-rl-exit" / job / "beat.rank1").read_text())
        t_kill = time.monotonic()
        os.kill(beat["pid"], signal.SIGKILL)
        _wait(lambda: "ended first, with exit code" in text(), None, "the failed rank's line")
        t_detected = time.monotonic()
        killed_in, done_before = _killed_in(steps_file, steps)
        _wait(lambda: "(step 2 of this job)" in text(), None, "the restart on the spare")
        t_restart = time.monotonic()
        resumed = _wait(lambda: RESUMED.search(text()), None, "the resume line")
        t_resumed = time.monotonic()
        at_step, load_s = int(resumed.group(2)), float(resumed.group(3))
        start = len(_records(steps_file))
        _wait(
            lambda: next((r for r in _records(steps_file)[start:] if r["step"] == killed_in), None),
            None,
            f"step {killed_in}'s record after the restart",
        )
        t_next = time.monotonic()
        _wait(lambda: "megatron-rl job" in text() and " done, exit code" in text(), None, "the job's end")
        exit_code = int(re.search(r" done, exit code (\d+)", text()).group(1))
        redone = [done_before[s]["step_seconds"] for s in range(at_step + 1, killed_in)]
        partial = t_kill - seen[killed_in - 1]
        return {
            "recipe": "grpo_tiny_cpu",
            "ranks": 2,
            "steps": steps,
            "killed": {"rank": 1, "host": beat["host"], "in_step": killed_in, "after_s_of_it": partial},
            "resumed_at_step": at_step,
            "lost_steps": killed_in - 1 - at_step,
            "lost_work_s": partial + sum(redone),
            "step_s_mean": mean_step,
            "detection_s": t_detected - t_kill,
            "requeue_s": t_restart - t_detected,
            "requeue_source": "a job step on a spare node (cluster.spare_nodes=1), no queue wait",
            "startup_s": max(t_resumed - load_s - t_restart, 0.0),
            "checkpoint_load_s": load_s,
            "rerun_s": t_next - t_resumed,
            "second_run_exit": exit_code,
            "left_out": re.findall(r"== node (\S+) failed", text()),
            "log": str(log),
        }
    finally:
        if job:
            subprocess.run(["scancel", job], env=env, capture_output=True)
        subprocess.run(["bash", str(REPO / "tools/slurm_local.sh"), "down"], env=env, capture_output=True)


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="the run's steps (default 6)")
    p.add_argument(
        "--kill-after", type=int, default=3, help="kill rank 1 in the step after this one (default 3)"
    )
    p.add_argument("--slurm", action="store_true", help="also measure a real requeue on a local Slurm (root)")
    p.add_argument(
        "--spares",
        action="store_true",
        help="in a local Slurm job with a spare node: the restart on the spare",
    )
    p.add_argument("--smoke", action="store_true", help="4 steps, killed after 2")
    p.add_argument("--dir", default="", help="where the runs write (default: a temporary folder)")
    args = p.parse_args(argv)
    steps, kill_after = (4, 2) if args.smoke else (args.steps, args.kill_after)
    if not 1 <= kill_after < steps:
        p.error(
            f"--kill-after {kill_after}: give 1 to steps - 1 ({steps - 1}), so a checkpoint exists and a step is left"
        )
    if args.slurm and args.spares:
        p.error("--slurm and --spares measure two ways back: give one")
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="recovery-"))
    if args.spares:
        out = measure_spares(steps, kill_after, tmp)
    else:
        out = measure(steps, kill_after, tmp)
        out["requeue_s"], out["requeue_source"] = out["relaunch_s"], "relaunch on this machine"
    if args.slurm:
        out.update(slurm_requeue())
        out["requeue_s"], out["requeue_source"] = out["slurm_requeue_s"], "scontrol requeue on a local Slurm"
    parts = ("detection_s", "requeue_s", "startup_s", "checkpoint_load_s", "rerun_s")
    out["total_s"] = sum(out[k] for k in parts)
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0 if out["second_run_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
