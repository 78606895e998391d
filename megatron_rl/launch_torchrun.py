"""torchrun, ending in one line per failed rank instead of torchrun's own traceback.

    python -m megatron_rl.launch_torchrun [torchrun args...]

The ranks already print their errors on the terminal (telemetry/console.py); torchrun's
ChildFailedError traceback would add some thirty lines of its own frames around them. The exit code is
that of the first rank that failed (so a preempted run's 75 reaches the launcher), or 1.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as e:
        # Ranks that exited on their own first; the ones torchrun then stopped (SIGTERM) after them.
        failures = sorted(e.failures.items(), key=lambda kv: (kv[1].exitcode <= 0, kv[1].timestamp))
        for rank, f in failures:
            how = f"signal {f.signal_name()}" if f.exitcode < 0 else f"exit code {f.exitcode}"
            print(f"rank {rank} (pid {f.pid}) ended with {how}", file=sys.stderr)
        first = failures[0][1].exitcode if failures else 1
        return first if first > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
