"""Preemption: SIGUSR1 / SIGTERM (from `#SBATCH --signal=USR1@120` or a scheduler) asks the run to
save at the next step boundary and exit with EXIT_REQUEUE (system/failover.py), which slurm/train.sbatch turns into
`scontrol requeue`. The current phase is never interrupted: collectives stay matched across ranks.

The flag is a host value, so the agreement runs on the explicit gloo group
(`ParallelState.cpu_group`): on the default group, NCCL on GPU, a host tensor is refused.
"""

from __future__ import annotations

import logging
import signal

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class Preemption:
    def __init__(self, group=None, signals=(signal.SIGUSR1, signal.SIGTERM)):
        """`group`: a gloo group over every rank (`ParallelState.cpu_group`); None only without
        torch.distributed or when the default group is itself gloo."""
        self.group = group
        self.flag = False
        self.signum: int | None = None
        for s in signals:
            signal.signal(s, self._handler)

    def _handler(self, signum, frame) -> None:
        self.flag, self.signum = True, signum
        log.warning(
            "received %s: will save at the end of this step and exit for requeue", signal.Signals(signum).name
        )

    def requested(self) -> bool:
        """True on every rank if any rank got the signal (signals reach ranks at different times)."""
        t = torch.tensor([1.0 if self.flag else 0.0], device="cpu")
        if dist.is_initialized():
            if self.group is None and dist.get_backend() != "gloo":
                raise RuntimeError(
                    f"Preemption needs a gloo group for its host flag (the default group is "
                    f"{dist.get_backend()}): pass ParallelState.cpu_group"
                )
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())
