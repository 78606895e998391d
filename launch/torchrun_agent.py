"""torchrun, made safe to run as a Slurm task: same arguments as `torchrun`.

Two differences, both for `LAUNCHER=torchrun` in slurm/train.sbatch (one torchrun per node):
- Slurm delivers `--signal=USR1@120` to every process of the step, this agent included. USR1's
  default action would kill the agent and with it the node's ranks before they can save; here the
  agent ignores it through a handler (a handler, unlike SIG_IGN, is not inherited by the ranks).
- Under srun, `--node-rank` defaults to the task's SLURM_NODEID, so ranks are numbered node by node
  exactly as with one srun task per GPU.
"""

from __future__ import annotations

import os
import signal
import sys


def agent_args(argv: list[str], env: dict[str, str]) -> list[str]:
    """torchrun's arguments, with --node-rank from Slurm when it is not given."""
    has_node_rank = any(a.startswith(("--node-rank", "--node_rank")) for a in argv)
    if not has_node_rank and "SLURM_NODEID" in env:
        return [f"--node-rank={env['SLURM_NODEID']}", *argv]
    return list(argv)


def main() -> int:
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    from torch.distributed.run import main as torchrun

    sys.argv = ["torchrun", *agent_args(sys.argv[1:], dict(os.environ))]
    torchrun()
    return 0


if __name__ == "__main__":
    sys.exit(main())
