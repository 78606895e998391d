"""Can this machine run a recipe's cluster? The rule the driver, `launch_local` and `megatron-rl doctor`
share: a GPU cluster (`cluster.gpu` other than cpu) needs CUDA here, else one line names the cluster,
torch's CUDA build and the likely cause, before anything starts (without it a GPU recipe would run
its CPU branches to the end)."""

from __future__ import annotations

import sys

from megatron_rl.system.machine import MIN_DRIVER, Facts


def release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string (local and pre-release parts dropped)."""
    from packaging.version import Version

    return Version(version).release[:3]


def device_refusal(cluster: str, gpu: str, f: Facts) -> str | None:
    """Rule 1, pure: why a run on GPU cluster `cluster` cannot start on a machine with facts `f`."""
    if gpu == "cpu" or f.cuda_available:
        return None
    if f.torch_cuda is None:
        build = f"torch {f.torch} is a CPU-only build (torch.version.cuda is None)"
        cause = (
            "install a CUDA build of torch (README: GPU setup), or choose a CPU cluster (cluster=cpu_2core)"
        )
    else:
        build = f"torch {f.torch} is built for CUDA {f.torch_cuda}"
        major = int(f.torch_cuda.split(".")[0])
        need = MIN_DRIVER.get(major)
        if f.driver is None:
            cause = (
                "no NVIDIA driver found (no /proc/driver/nvidia/version, no nvidia-smi): not a GPU node, or "
                "no GPU given to this job or container"
            )
        elif need and release(f.driver)[:2] < need:
            cause = (
                f"the NVIDIA driver {f.driver} is older than the {need[0]}.{need[1]} that CUDA {major} needs: "
                f"update the driver, or install a torch built for an older CUDA"
            )
        elif f.cuda_visible_devices is not None and not f.cuda_visible_devices.strip():
            cause = (
                f"NVIDIA driver {f.driver}, but CUDA_VISIBLE_DEVICES is empty: no GPU given to this process"
            )
        else:
            cause = f"NVIDIA driver {f.driver}; torch says: {f.cuda_error or 'no CUDA device visible'}"
    return f"cluster {cluster} is a GPU cluster (gpu={gpu}) but CUDA is unavailable here: {build}; {cause}"


def refusal_for(cluster) -> str | None:
    """Rule 1 for a recipe's cluster on this machine (torch is imported only for a GPU cluster)."""
    if cluster.gpu == "cpu":
        return None
    from megatron_rl.system.machine import probe_cuda

    return device_refusal(cluster.name, cluster.gpu, probe_cuda())


def require_device(cluster) -> None:
    """The driver's form of rule 1: one line on stderr and exit 2, before anything is built."""
    refusal = refusal_for(cluster)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(2)
