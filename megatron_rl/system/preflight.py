"""Pre-flight health check of a job's nodes, before a long run starts on them.

Every rank measures its own device and the links it trains over, and each node is judged against the
cluster config's figures (`cluster.*`), each at least a fraction of its expected value:
- `gemm_tflops`: a square matmul (bf16 on a GPU, fp32 on a CPU), against `peak_tflops_bf16` x
  `preflight_gemm_fraction`; a node's figure is its slowest device's.
- `memory_gbps`: a device-to-device copy (bytes read + written per second), against
  `hbm_bandwidth_tbps` x `preflight_memory_fraction`.
- `nvml` (GPU only): NVML's health of each GPU: no uncorrected ECC error since the driver loaded, no row
  remapping pending or failed (no retired page pending on GPUs before row remapping). A counter NVML
  cannot read fails the node: a check that cannot prove health does not pass it.
- `allreduce_intra_gbps`: all-reduce bus bandwidth among the node's ranks (NCCL, gloo on CPU), against
  `nvlink_gbps` x `preflight_allreduce_fraction`; a one-rank node has none.
- `allreduce_inter_gbps`: the same over every rank of a multi-node job, against the NIC bandwidth per
  GPU (`ib_gbps_per_nic` x `nics_per_node` / `gpus_per_node`, in GB/s) x the same fraction. A ring is
  as slow as its slowest link and cannot say which node that is: below threshold it fails the job, not
  a node.

Bus bandwidth is NCCL's convention: bytes x 2(n-1)/n / seconds, comparable across world sizes. The
verdict (`judge`) is a pure function of the figures, so the rule is tested without devices.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field

# Sizes: large enough to reach a device's steady rate, small enough to take seconds.
GPU_GEMM_N, CPU_GEMM_N = 8192, 1024
GPU_COPY_BYTES, CPU_COPY_BYTES = 1 << 30, 64 << 20
GPU_ALLREDUCE_BYTES, CPU_ALLREDUCE_BYTES = 256 << 20, 8 << 20


@dataclass(frozen=True)
class Expected:
    """What a healthy node reaches, from the cluster config, and the fraction of it each test needs."""

    gemm_tflops: float
    memory_gbps: float
    intra_gbps: float
    inter_gbps: float
    gemm_fraction: float
    memory_fraction: float
    allreduce_fraction: float

    @classmethod
    def from_cluster(cls, c) -> Expected:
        return cls(
            gemm_tflops=c.peak_tflops_bf16,
            memory_gbps=c.hbm_bandwidth_tbps * 1000.0,
            intra_gbps=c.nvlink_gbps,
            inter_gbps=c.ib_gbps_per_nic * c.nics_per_node / max(c.gpus_per_node, 1) / 8.0,
            gemm_fraction=c.preflight_gemm_fraction,
            memory_fraction=c.preflight_memory_fraction,
            allreduce_fraction=c.preflight_allreduce_fraction,
        )


@dataclass
class RankFigures:
    """One rank's measurements: its device's, and the all-reduces it took part in."""

    rank: int
    host: str
    device: str
    gemm_tflops: float
    memory_gbps: float
    nvml: dict | None = None  # GPU only: {"ok": bool, "problems": [...], counters...}
    intra_gbps: float | None = None
    inter_gbps: float | None = None


@dataclass
class NodeVerdict:
    host: str
    ranks: list[int]
    figures: dict
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _below(name: str, got: float, want: float, fraction: float, unit: str, where: str) -> str | None:
    need = want * fraction
    if got >= need:
        return None
    return f"{name} {got:.3g} {unit}{where} < {fraction:g} x {want:.3g} {unit} expected"


def _rank_key(x: float) -> float:
    """Sort key for the slowest: a figure that is not a finite number (a timer or a device gone wrong)
    ranks below every measured one, so it is the one judged, and fails."""
    return x if math.isfinite(x) else -math.inf


def _worst(xs: list[float]) -> float:
    return min(xs, key=_rank_key)


def judge(ranks: list[RankFigures], expect: Expected) -> tuple[list[NodeVerdict], list[str]]:
    """Each node's verdict, and the job's failures no node can be blamed for (the inter-node ring)."""
    by_host: dict[str, list[RankFigures]] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        by_host.setdefault(r.host, []).append(r)
    nodes = []
    for host, rs in by_host.items():
        slow_gemm = min(rs, key=lambda r: _rank_key(r.gemm_tflops))
        slow_copy = min(rs, key=lambda r: _rank_key(r.memory_gbps))
        intra = [r.intra_gbps for r in rs if r.intra_gbps is not None]
        figures = {
            "gemm_tflops": slow_gemm.gemm_tflops,
            "memory_gbps": slow_copy.memory_gbps,
            "allreduce_intra_gbps": _worst(intra) if intra else None,
            "nvml": [r.nvml for r in rs] if any(r.nvml is not None for r in rs) else None,
        }
        v = NodeVerdict(host, [r.rank for r in rs], figures)
        for problem in (
            _below("gemm", slow_gemm.gemm_tflops, expect.gemm_tflops, expect.gemm_fraction, "TFLOPS",
                   f" on {slow_gemm.device}"),
            _below("memory copy", slow_copy.memory_gbps, expect.memory_gbps, expect.memory_fraction, "GB/s",
                   f" on {slow_copy.device}"),
            _below("all-reduce in the node", _worst(intra), expect.intra_gbps, expect.allreduce_fraction, "GB/s",
                   "") if intra else None,
        ):  # fmt: skip
            if problem:
                v.failures.append(problem)
        for r in rs:
            if r.nvml is not None and not r.nvml.get("ok"):
                v.failures += [f"{r.device}: {p}" for p in r.nvml.get("problems", ["NVML health unknown"])]
        nodes.append(v)
    job: list[str] = []
    inter = [r.inter_gbps for r in ranks if r.inter_gbps is not None]
    if inter:
        problem = _below("all-reduce across nodes", _worst(inter), expect.inter_gbps, expect.allreduce_fraction,
                         "GB/s", "")  # fmt: skip
        if problem:
            job.append(problem)
    return nodes, job


def gemm_tflops(device) -> float:
    """Dense matmul rate of `device`: bf16 on a GPU (what training runs), fp32 on a CPU (its native)."""
    import torch

    cuda = device.type == "cuda"
    n, dtype, reps = (GPU_GEMM_N, torch.bfloat16, 20) if cuda else (CPU_GEMM_N, torch.float32, 4)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 * reps / _timed(lambda: a @ b, reps, device) / 1e12


def memory_gbps(device) -> float:
    """Copy bandwidth of `device`'s memory: bytes read plus bytes written per second."""
    import torch

    cuda = device.type == "cuda"
    size, reps = (GPU_COPY_BYTES, 10) if cuda else (CPU_COPY_BYTES, 5)
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return 2 * size * reps / _timed(lambda: dst.copy_(src), reps, device) / 1e9


def allreduce_gbps(group, n: int, device) -> float:
    """Bus bandwidth of an all-reduce over `group` (n ranks): bytes x 2(n-1)/n per second. Collective:
    every rank of the group calls it."""
    import torch
    import torch.distributed as dist

    size = GPU_ALLREDUCE_BYTES if device.type == "cuda" else CPU_ALLREDUCE_BYTES
    x = torch.ones(size // 4, dtype=torch.float32, device=device)
    reps = 5
    seconds = _timed(lambda: dist.all_reduce(x, group=group), reps, device)
    return size * 2 * (n - 1) / n * reps / seconds / 1e9


def _timed(op, reps: int, device) -> float:
    """Seconds for `reps` calls of `op` after one warm-up, the device drained on both ends."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    op()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        op()
    sync()
    return max(time.perf_counter() - t0, 1e-9)


def nvml_health(index: int) -> dict:
    """NVML's view of GPU `index`: uncorrected volatile ECC errors and row remapping (or, on GPUs before
    it, retired pages pending). Whatever NVML cannot read is a problem: unproven is not healthy."""
    out: dict = {"ok": False, "problems": []}
    try:
        import pynvml
    except ImportError:
        out["problems"].append(
            "pynvml is not installed, so NVML health cannot be read: pip install nvidia-ml-py (in the gpu extra)"
        )
        return out
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        out["problems"].append(f"NVML does not start: {e}")
        return out
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            ecc = pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
            out["ecc_uncorrected_volatile"] = int(ecc)
            if ecc:
                out["problems"].append(f"{ecc} uncorrected ECC error(s) since the driver loaded")
        except pynvml.NVMLError as e:
            out["problems"].append(f"ECC counters unreadable ({e}): is ECC enabled?")
        try:
            _corr, _uncorr, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
            out["remapped_rows_pending"], out["remapped_rows_failure"] = bool(pending), bool(failure)
            if pending:
                out["problems"].append("a row remapping is pending: reset the GPU before using it")
            if failure:
                out["problems"].append("row remapping failed: the GPU needs service")
        except pynvml.NVMLError_NotSupported:
            try:
                pending = pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
                out["retired_pages_pending"] = bool(pending)
                if pending:
                    out["problems"].append("retired pages are pending: reset the GPU before using it")
            except pynvml.NVMLError as e:
                out["problems"].append(f"neither row remapping nor page retirement is readable ({e})")
        except pynvml.NVMLError as e:
            out["problems"].append(f"row remapping unreadable ({e})")
    except pynvml.NVMLError as e:
        out["problems"].append(f"GPU {index} unreadable through NVML: {e}")
    finally:
        pynvml.nvmlShutdown()
    out["ok"] = not out["problems"]
    return out


def host_name() -> str:
    """The node's name as Slurm knows it (what `--exclude` takes; several simulated nodes share one
    host), else the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
