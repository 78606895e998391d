"""Per-rank bootstrap shared by srun (one task per GPU) and torchrun: ranks in, entry point out.

    python launch/rank.py ENTRY [ARGS...]
    ENTRY: a module run like `python -m ENTRY` (megatron_rl.train) or the path of a .py script.

It maps the launcher's variables (SLURM_PROCID/SLURM_NTASKS/... or torchrun's RANK/WORLD_SIZE/...) to
one set of torchrun-style variables through megatron_rl.parallel.dist_env, so every entry point reads the same
ranks whoever started it, then runs the entry.

Normally it replaces itself with the entry (exec): the trainer keeps the task's PID and receives
Slurm's signals (USR1 before the time limit) with no wrapper process in between. When
MEGATRON_RL_EXIT_DIR is set (slurm/train.sbatch sets it), it stays as a small parent instead, only to
record a rank's own failure: `srun --kill-on-bad-exit` terminates the other ranks when one fails and
then reports the highest exit code (143, a terminated rank), which hides the failure that started it.
The parent writes `<time> <code> <rank> <host>` for a rank that exited non-zero on its own, so the
batch script can propagate the first failure's exit code and leave that rank's node out of the next
attempt (megatron_rl/system/failover.py). Slurm signals every process of a step, so the
parent does not forward signals; it only survives them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def entry_command(entry: str, args: list[str]) -> list[str]:
    """The interpreter command that runs ENTRY with ARGS."""
    if entry.endswith(".py"):
        return [sys.executable, entry, *args]
    return [sys.executable, "-m", entry, *args]


def _die_with_parent() -> None:
    # If the parent is SIGKILLed (Slurm's last resort), the entry must not outlive it.
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def run_and_record(cmd: list[str], exit_dir: Path, rank: int, host: str) -> int:
    """Run the entry as a child; record its exit code if it failed by itself (not terminated by us)."""
    terminated = False

    def on_terminate(signum: int, frame: object) -> None:
        nonlocal terminated
        terminated = True  # the child got the same signal from Slurm; its exit code is a consequence

    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGINT, on_terminate)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # meant for the trainer, not for this parent
    child = subprocess.Popen(cmd, preexec_fn=_die_with_parent)
    code = child.wait()
    code = 128 - code if code < 0 else code  # killed by signal N -> 128+N, as a shell reports it
    if code != 0 and not terminated:
        exit_dir.mkdir(parents=True, exist_ok=True)
        (exit_dir / f"rank{rank}").write_text(f"{time.time():.6f} {code} {rank} {host}\n")
    return code


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    sys.path.insert(0, str(REPO))
    from megatron_rl.parallel.dist_env import from_env

    dist = from_env()
    dist.export()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    cmd = entry_command(argv[0], argv[1:])
    exit_dir = os.environ.get("MEGATRON_RL_EXIT_DIR")
    if exit_dir:
        from megatron_rl.system.watchdog import host_name

        return run_and_record(cmd, Path(exit_dir), dist.rank, host_name())
    os.execv(sys.executable, cmd)
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
