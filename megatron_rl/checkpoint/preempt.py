"""Preemption: SIGUSR1 / SIGTERM (from `#SBATCH --signal=USR1@120` or a scheduler) asks the run to
save at the next step boundary and exit with EXIT_REQUEUE, which slurm/train.sbatch turns into
`scontrol requeue`. The current phase is never interrupted: collectives stay matched across ranks.
"""

from __future__ import annotations

import logging
import signal

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
EXIT_REQUEUE = 75  # EX_TEMPFAIL: "try again later"


class Preemption:
    def __init__(self, signals=(signal.SIGUSR1, signal.SIGTERM)):
        self.flag = False
        self.signum: int | None = None
        for s in signals:
            signal.signal(s, self._handler)

    def _handler(self, signum, frame) -> None:
        self.flag, self.signum = True, signum
        log.warning(
            "received %s: will save at the end of this step and exit for requeue", signal.Signals(signum).name
        )

    def requested(self, group=None) -> bool:
        """True on every rank if any rank got the signal (signals reach ranks at different times)."""
        t = torch.tensor([1.0 if self.flag else 0.0])
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return bool(t.item())
