"""torchrun, ending in one line per failed rank instead of torchrun's own traceback.

    python -m megatron_rl.cli.launch_torchrun [torchrun args...]

The ranks already print their errors on the terminal (telemetry/console.py); torchrun's
ChildFailedError traceback would add some thirty lines of its own frames around them. When the run's
log.txt is known (MEGATRON_RL_LOG, set by launch_local), the last lines of the rank that failed first
follow: what a rank killed by a signal (abort(), SIGSEGV, the OOM killer) wrote last, such as an NCCL
watchdog timeout or a faulthandler dump, never passes through our handlers. The exit code is that of the
first rank that failed (so a preempted run's 75 reaches the launcher), or 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

LOG_ENV = "MEGATRON_RL_LOG"
TAIL_LINES = 8


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as e:
        # Ranks that ended on their own first (an exit code, or a signal torchrun did not send); then
        # the ones torchrun stopped (SIGTERM) after them.
        def stopped(f) -> bool:
            return f.exitcode == -signal.SIGTERM

        failures = sorted(e.failures.items(), key=lambda kv: (stopped(kv[1]), kv[1].timestamp))
        for rank, f in failures:
            how = f"signal {f.signal_name()}" if f.exitcode < 0 else f"exit code {f.exitcode}"
            print(f"rank {rank} (pid {f.pid}) ended with {how}", file=sys.stderr)
        if failures and os.environ.get(LOG_ENV):
            show_rank_tail(Path(os.environ[LOG_ENV]), failures[0][0])
        first = failures[0][1].exitcode if failures else 1
        return first if first > 0 else 1
    return 0


def rank_tail(log: Path, rank: int, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines one rank wrote into the shared log.txt (its `[rankN] ` prefix)."""
    prefix = f"[rank{rank}] "
    ours = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(prefix)]
    return ours[-lines:]


def show_rank_tail(log: Path, rank: int, lines: int = TAIL_LINES) -> None:
    if not log.is_file():
        return
    # A dead rank's tee (telemetry/console.py) may still be draining its last lines into log.txt.
    deadline, size = time.monotonic() + 3.0, -1
    while time.monotonic() < deadline and log.stat().st_size != size:
        size = log.stat().st_size
        time.sleep(0.3)
    tail = rank_tail(log, rank, lines)
    if tail:
        print(f"run failed; the last {len(tail)} lines of rank {rank} in {log}:", file=sys.stderr)
        print("\n".join("  " + line for line in tail), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
