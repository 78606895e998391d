"""When a rank fails: which node is to blame, and whether the run goes on without it.

slurm/train.sbatch runs the ranks as one job step on `cluster.nodes` of the job's nodes; the others
(`cluster.spare_nodes`) wait. When the step ends with a failure, the script asks `after` (through
`python -m megatron_rl.cli.failover`) what happened, from two kinds of file the step left in its exit folder:

- an exit record per rank that ended on its own (launch/rank.py): `<time> <code> <rank> <host>`;
- a heartbeat per rank (system/watchdog.py): host, pid and the time of its last beat, written by a
  thread of its own every `interval_s`, whatever the rank's main thread is doing.

A node is blamed when one of its ranks was killed by a signal (kill -9, a segfault, the kernel's OOM
killer), or failed with EXIT_NODE_FAULT (its device or its rollout engine failed), or stopped beating
while the others still beat (a node that hangs: a frozen kernel, a GPU that stops answering, a process
stopped). A rank that lost its peer (EXIT_PEER_LOST: a collective's connection closed or timed out) is
not the cause, only its witness. Any other failure (exit 1: an error of the run itself, which would recur
on any node; 2: bad input) ends the job: restarting it elsewhere would fail the same way.

A blamed node is replaced by a spare; with none left, and with no node to blame (a transient fault), the
run restarts on the same nodes. Every restart counts against `cluster.max_restarts` per job. When every
node of a step of several nodes is blamed, the fault is not in the nodes and the job ends. The
preflight's verdict is read here too (`after_preflight`): a node it failed is left out while spares last.
"""

from __future__ import annotations

import json
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path

EXIT_REQUEUE = (
    75  # EX_TEMPFAIL: the run saved after SIGUSR1/SIGTERM and asks for more time (checkpoint/preempt.py)
)
EXIT_PEER_LOST = 76  # a collective with another rank failed or timed out: another rank is the cause
EXIT_NODE_FAULT = 77  # this rank's device or rollout engine failed: its node is suspect
EXIT_BAD_INPUT = 2
BEAT_PREFIX = "beat.rank"


@dataclass(frozen=True)
class ExitRecord:
    """A rank that ended on its own, non-zero (launch/rank.py writes it; srun's stopped ranks do not)."""

    time: float
    code: int
    rank: int
    host: str

    @property
    def why(self) -> str:
        if self.code > 128:
            try:
                name = signal.Signals(self.code - 128).name
            except ValueError:
                name = f"signal {self.code - 128}"
            return f"rank {self.rank} was killed by {name}"
        if self.code == EXIT_NODE_FAULT:
            return f"rank {self.rank}'s device or rollout engine failed (exit {self.code})"
        return f"rank {self.rank} exited with code {self.code}"


@dataclass(frozen=True)
class Beat:
    """A rank's last heartbeat (system/watchdog.py)."""

    rank: int
    host: str
    pid: int
    time: float
    interval_s: float
    phase: str = ""
    gap: tuple[float, float] | None = None  # the last time its beats stopped and came back: (from, to)


@dataclass(frozen=True)
class Verdict:
    """What the job does next: `retry` on `nodes`, or `stop`; `blamed`: host -> why."""

    action: str
    nodes: tuple[str, ...]
    blamed: dict[str, str]
    why: str


def read_exit_records(folder: Path) -> list[ExitRecord]:
    """The exit records in `folder`, oldest first. A record that does not parse is an error, not a skip:
    a failure nobody can read must not pass for no failure."""
    out = []
    for f in sorted(folder.glob("rank*")):
        parts = f.read_text().split()
        if len(parts) < 3:
            raise ValueError(f"exit record {f} is not '<time> <code> <rank> [host]': {parts}")
        host = parts[3] if len(parts) > 3 else ""
        out.append(ExitRecord(float(parts[0]), int(parts[1]), int(parts[2]), host))
    return sorted(out, key=lambda r: r.time)


def read_beats(folder: Path) -> list[Beat]:
    """The heartbeats in `folder`; one being replaced at the moment it is read is skipped (its `.tmp`)."""
    out = []
    for f in sorted(folder.glob(f"{BEAT_PREFIX}*")):
        if f.name.endswith(".tmp"):
            continue
        d = json.loads(f.read_text())
        out.append(
            Beat(
                int(d["rank"]),
                str(d["host"]),
                int(d["pid"]),
                float(d["time"]),
                float(d["interval_s"]),
                str(d.get("phase", "")),
                (float(d["gap"][0]), float(d["gap"][1])) if d.get("gap") else None,
            )
        )
    return out


def stale_after_s(interval_s: float) -> float:
    """How far a rank's last beat may lag the newest of the step before the rank counts as hung: three
    missed beats and 10 s for a loaded host."""
    return 3 * interval_s + 10.0


def blame(records: list[ExitRecord], beats: list[Beat]) -> dict[str, str]:
    """host -> why, for every node this step's files show at fault (module docstring)."""
    out: dict[str, str] = {}
    for r in records:
        if (r.code > 128 or r.code == EXIT_NODE_FAULT) and r.host:
            out.setdefault(r.host, r.why)
    if beats:
        newest = max(b.time for b in beats)
        ended = {r.rank for r in records}
        first_failure = records[0].time if records else None
        for b in sorted(beats, key=lambda b: b.time):
            if b.rank in ended:
                continue
            where = f" in phase {b.phase}" if b.phase else ""
            lag = newest - b.time
            if lag > stale_after_s(b.interval_s):  # silent to the end
                why = f"stopped beating{where} {lag:.0f} s before the others"
            elif b.gap and first_failure is not None and b.gap[0] <= first_failure <= b.gap[1]:
                # silent while its peers failed, woken only to be stopped (Slurm sends SIGCONT before SIGKILL)
                why = f"stopped beating{where} {first_failure - b.gap[0]:.0f} s before the first failure"
            else:
                continue
            out.setdefault(b.host, f"rank {b.rank} (pid {b.pid}) {why}: hung")
    return out


def _machine_code(code: int) -> bool:
    """An exit code that says the machines failed: killed by a signal, a lost peer, a failed engine or device."""
    return code > 128 or code in (EXIT_PEER_LOST, EXIT_NODE_FAULT)


def healthy(allocated: list[str], bad: set[str]) -> list[str]:
    """The allocated nodes not left out, in allocation order."""
    return [n for n in allocated if n not in bad]


def pick(allocated: list[str], bad: set[str], need: int) -> list[str]:
    """The first `need` allocated nodes not known bad, in allocation order (the first is rank 0's)."""
    healthy_nodes = healthy(allocated, bad)
    if len(healthy_nodes) < need:
        raise LookupError(
            f"{len(healthy_nodes)} healthy node(s) of the {need} the run needs (allocated {','.join(allocated)}; "
            f"left out {','.join(sorted(bad)) or 'none'})"
        )
    return healthy_nodes[:need]


def after(
    rc: int,
    records: list[ExitRecord],
    beats: list[Beat],
    used: list[str],
    allocated: list[str],
    bad: set[str],
    restarts: int,
    max_restarts: int,
) -> Verdict:
    """What the job does after a step of the run ended with `rc` (the first failed rank's code, as the
    batch script reports it). `bad`: nodes left out already; `restarts`: restarts this job made so far."""
    if rc in (0, EXIT_REQUEUE, EXIT_BAD_INPUT):
        return Verdict("stop", (), {}, "")
    machines = [r for r in records if _machine_code(r.code)]
    if not machines and not _machine_code(rc):
        # Fail closed: only a failure that says it is the machines' (a signal, a lost peer, a failed engine or
        # device) is restarted; any other, or one no record explains, would recur on any node.
        own = [r for r in records if not _machine_code(r.code)]
        what = (
            f"{own[0].why} on {own[0].host or 'its node'}" if own else f"the step ended with exit code {rc}"
        )
        return Verdict(
            "stop",
            (),
            {},
            f"{what}: an error of the run, not of a node (it would recur on any node), so the job ends; "
            "its log.txt says why",
        )
    blamed = blame(records, beats)
    if len(used) > 1 and set(used) <= set(blamed):
        return Verdict(
            "stop", (), blamed, "every node of the step failed: the fault is not in one node, so the job ends"
        )
    if restarts >= max_restarts:
        return Verdict(
            "stop", (), blamed, f"{restarts} restart(s) already (cluster.max_restarts={max_restarts})"
        )
    if not blamed:
        return Verdict("retry", tuple(used), blamed, "no node to blame: retrying on the same nodes")
    try:
        nodes = pick(allocated, bad | set(blamed), len(used))
    except LookupError as e:
        # A fault may be transient (an engine that crashed once): restart where the run was rather than end a
        # long job, bounded by max_restarts like every restart.
        return Verdict(
            "retry",
            tuple(used),
            blamed,
            f"no spare left ({e}): retrying on the same nodes; add cluster.spare_nodes, or resubmit with "
            f"--exclude={','.join(sorted(blamed))} if it fails again",
        )
    return Verdict(
        "retry",
        tuple(nodes),
        blamed,
        "continuing on " + ",".join(nodes) + " without " + ",".join(sorted(blamed)),
    )


class EngineCrashed(RuntimeError):
    """A rollout engine failed in this rank's process (a vLLM error, a CUDA error inside it, requests it
    dropped): the step cannot finish, and the rank ends with EXIT_NODE_FAULT."""


# What a lost peer looks like from a surviving rank: gloo's and NCCL's words for a closed connection, a
# collective or store wait that timed out, and the communicator that error handling aborted.
_PEER_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "timed out waiting",
    "socket timeout",
    "watchdog caught collective operation timeout",
    "communicator was aborted",
    "nccl communicator",
    "remote process exited",
)
_DEVICE_FAULT = ("cuda error", "cublas_status", "cudnn_status", "illegal memory access", "uncorrectable ecc")


def exit_code_for(e: BaseException) -> tuple[int, str] | None:
    """The exit code and one line for an uncaught error that is a failure of the job's machines rather than
    of the run (None: it is the run's own, exit 1). The batch script's failover reads these codes."""
    if isinstance(e, EngineCrashed):
        return EXIT_NODE_FAULT, str(e)
    chain, seen = [], e
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " | ".join(f"{type(x).__name__}: {x}" for x in chain).lower()
    names = {type(x).__name__ for x in chain}
    # Only torch.distributed's errors speak for a peer: the same words from the run's own code (a judge that
    # timed out, a closed pipe) are the run's.
    collective = any("gloo" in text or "nccl" in text or _through_distributed(x) for x in chain)
    if names & {"DistNetworkError", "DistStoreError"} or (collective and any(p in text for p in _PEER_LOST)):
        first = str(chain[0]).strip().splitlines()[0] if str(chain[0]).strip() else type(chain[0]).__name__
        first = first if len(first) <= 160 else first[:157] + "..."
        return EXIT_PEER_LOST, (
            f"lost a peer rank at a collective ({first}): another rank died or hung, and this rank ends "
            "with it; the job's failover names the node"
        )
    if any(p in text for p in _DEVICE_FAULT) and "out of memory" not in text:  # OOM: the run's size, anywhere
        return EXIT_NODE_FAULT, f"this rank's device failed: {str(chain[0]).strip().splitlines()[0]}"
    return None


def _through_distributed(e: BaseException) -> bool:
    """Whether `e` was raised inside torch.distributed (its traceback passes through it)."""
    return any(
        "torch/distributed" in f.filename.replace("\\", "/") for f in traceback.extract_tb(e.__traceback__)
    )


def after_preflight(
    verdict: dict | None, rc: int, allocated: list[str], bad: set[str], need: int
) -> tuple[str, list[str]]:
    """What the job does after `megatron-rl preflight` exited `rc` with `verdict` (rank 0's JSON; None: none
    was written or it does not parse): `ok`; `spare` (leave the failed nodes out, spares take their place);
    `stop` (too few spares: exit 3, named); `ring` (every node passed, the all-reduce across them did not:
    no node to leave out, exit 1); `refused` (a failure without a verdict: its exit code). Fail closed: a
    verdict that names no failure explains no failed exit."""
    if rc == 0:
        return "ok", []
    if not isinstance(verdict, dict):
        return "refused", []
    failed = [str(n) for n in verdict.get("exclude") or []]
    if not failed:
        return ("ring", []) if verdict.get("job_failures") else ("refused", [])
    return ("spare" if len(healthy(allocated, bad | set(failed))) >= need else "stop"), failed
