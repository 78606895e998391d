"""Time and peak memory of every phase on every rank, reduced with MAX over ranks.

A later step or a second publication can allocate more than the first, and rank 0 is rarely the
rank that runs out of memory (the last PP stage holds the logits; an engine rank holds the KV
cache), so each phase's peak is reset when it starts and the step record keeps the maximum over
all ranks, next to the per-rank values.

Peaks: on GPU, `torch.cuda` allocated and reserved with `reset_peak_memory_stats` per phase; on
CPU, the resident high-water mark (VmHWM), reset per phase through /proc/self/clear_refs (Linux
>= 4.0). Where the reset is not permitted the process-lifetime peak is reported and flagged.

Each phase call also leaves a span (name, start, end; wall-clock seconds since the epoch) so a trace can
show every rank's phases side by side (`megatron-rl report --trace`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

PHASES = (
    "init",
    "generation",
    "scoring",
    "old_logprobs",
    "ref_logprobs",
    "reward_model",  # a learned reward model's scores (reward.model_checkpoint: loop/step/ppo.py)
    "critic_values",  # PPO: the critic's values before the updates
    "train_fwd_bwd",
    "optimizer",
    "critic_train",  # PPO: the critic's updates (forward, backward and optimizer step)
    "publish",
    "probe",  # the log-prob probe of each publication, before it serves (loop/placement/probe.py)
)
GIB = 2**30


def _read_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def reset_cpu_peak() -> bool:
    """Reset VmHWM to the current RSS. Returns False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_peak_gib() -> float:
    return _read_status_kib("VmHWM") / 2**20


@dataclass
class PhaseStats:
    seconds: float = 0.0
    mem_gib: float = 0.0  # CPU: resident peak; GPU: max allocated
    reserved_gib: float = 0.0  # GPU only
    calls: int = 0


@dataclass
class PhaseTimer:
    """Accumulates per-phase wall time and peak memory on this rank for the current step."""

    cuda: bool = field(default_factory=torch.cuda.is_available)
    stats: dict[str, PhaseStats] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    peak_reset_ok: bool = True
    # Told each phase's name as it starts (the progress bar shows it), whoever times the phase.
    on_enter: Callable[[str], None] | None = None
    _open: list[list[float]] = field(default_factory=list, repr=False)  # phases open, outermost first

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time `name`. A phase opened inside another (the log-prob probe inside the publication) counts
        its seconds as its own only: the outer one's time excludes it, so phases still add up to the step.
        Peaks: the outer phase's peak covers the inner one's too."""
        if self.on_enter is not None:
            self.on_enter(name)
        if self._open:  # the peak reset below would lose what the outer phase reached so far
            self._open[-1][1] = max(self._open[-1][1], self._peak())
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.peak_reset_ok = reset_cpu_peak() and self.peak_reset_ok
        frame = [0.0, 0.0]  # seconds of phases opened inside this one, peak before their resets
        self._open.append(frame)
        wall0, t0 = time.time(), time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            self._open.pop()
            if self._open:
                self._open[-1][0] += dt
            self.spans.append((name, round(wall0, 4), round(wall0 + dt, 4)))
            s = self.stats.setdefault(name, PhaseStats())
            s.seconds += dt - frame[0]
            s.calls += 1
            s.mem_gib = max(s.mem_gib, frame[1], self._peak())
            if self.cuda:
                s.reserved_gib = max(s.reserved_gib, torch.cuda.max_memory_reserved() / GIB)

    def _peak(self) -> float:
        return torch.cuda.max_memory_allocated() / GIB if self.cuda else cpu_peak_gib()

    def add(self, name: str, seconds: float, mem_gib: float = 0.0) -> None:
        """Count seconds (and a peak) measured elsewhere in this step's phase `name`: a separated job's
        trainer records the engines' generation and scoring, which ran on the engine ranks (loop/placement/feed.py)."""
        s = self.stats.setdefault(name, PhaseStats())
        s.seconds += seconds
        s.calls += 1
        s.mem_gib = max(s.mem_gib, mem_gib)

    def take(self) -> dict[str, PhaseStats]:
        """This step's stats, and start a new step."""
        out, self.stats = self.stats, {}
        return out

    def take_spans(self) -> list[tuple[str, float, float]]:
        """This step's (phase, start, end) spans in the order they ran, and start a new list."""
        out, self.spans = self.spans, []
        return out


def gather_spans(local: list[tuple[str, float, float]], cpu_group=None) -> list[list[list]]:
    """Every rank's phase spans of this step, indexed by rank. Collective over `cpu_group` (gloo: Python
    objects)."""
    import torch.distributed as dist

    mine = [[n, a, b] for n, a, b in local]
    if not dist.is_initialized():
        return [mine]
    out: list = [None] * dist.get_world_size(cpu_group)
    dist.all_gather_object(out, mine, group=cpu_group)
    return out


def reduce_over_ranks(local: dict[str, PhaseStats], names: tuple[str, ...], group=None) -> dict[str, dict]:
    """Gather every rank's phase stats; return per phase the MAX over ranks and the per-rank lists.

    Collective: every rank calls it with the same `names`. Phases a rank did not run count as 0 there.
    """
    import torch.distributed as dist

    vals = torch.tensor(
        [
            [
                local.get(n, PhaseStats()).seconds,
                local.get(n, PhaseStats()).mem_gib,
                local.get(n, PhaseStats()).reserved_gib,
            ]
            for n in names
        ],
        dtype=torch.float64,
    )
    if dist.is_initialized():
        world = dist.get_world_size(group)
        bufs = [torch.zeros_like(vals) for _ in range(world)]
        dist.all_gather(bufs, vals, group=group)
    else:
        bufs = [vals]
    stacked = torch.stack(bufs)  # [rank, phase, 3]
    out = {}
    for i, n in enumerate(names):
        col = stacked[:, i, :]
        out[n] = {
            "seconds": float(col[:, 0].max()),
            "mem_gib": float(col[:, 1].max()),
            "reserved_gib": float(col[:, 2].max()),
            "seconds_by_rank": [round(float(x), 6) for x in col[:, 0]],
            "mem_gib_by_rank": [round(float(x), 6) for x in col[:, 1]],
        }
    return out
