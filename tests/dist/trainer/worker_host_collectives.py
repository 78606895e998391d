"""torchrun worker (2 ranks, gloo) under MEGATRON_RL_DEVICE_GUARD=1: host tensors on device groups.

    torchrun --nproc-per-node 2 worker_host_collectives.py ROOT

Prints one JSON line (rank 0) prefixed with RESULT: for each case, "ok" or the guard's error.
"""

import json
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

# Checkpointer._check_space before the fix, verbatim: a host tensor all-reduced on the default group
# (NCCL on GPU: "No backend type associated with device type cpu"). Run as megatron_rl code outside
# the trainer's modules, where the device trap does not move tensors to meta.
PRE_FIX = """
import torch
import torch.distributed as dist

def check_space(local_bytes):
    t = torch.tensor([local_bytes, 0], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t[0])

def derived(local_bytes):
    t = torch.tensor([local_bytes], dtype=torch.int64) * 2  # computed from a host tensor: still host
    dist.all_reduce(t)
    return int(t[0])

def host_copy(t):
    t = t.cpu()
    dist.all_reduce(t)
"""


def _try(fn) -> str:
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"{type(e).__name__}: {e}"


def main() -> None:
    from megatron_rl.checkpoint.save import Checkpointer
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.trainer.parallel import init_parallel, launched_world

    state = init_parallel(ParallelLayout.over(launched_world(), 1, 1))
    root = Path(sys.argv[1]) / f"rank{dist.get_rank()}"
    probe = types.ModuleType("megatron_rl.checkpoint._pre_fix_probe")
    exec(PRE_FIX, probe.__dict__)
    procs = types.SimpleNamespace(rank=dist.get_rank(), is_main=dist.get_rank() == 0)
    fixed = Checkpointer(root, procs, async_save=False, cpu_group=state.cpu_group)
    bare = Checkpointer(root, procs, async_save=False)  # no group: what tools/gpu_check.py builds
    result = {
        "pre_fix": _try(lambda: probe.check_space(100)),
        "derived": _try(lambda: probe.derived(100)),
        "host_copy": _try(lambda: probe.host_copy(torch.zeros(2, device=state.device))),
        "fixed": _try(lambda: fixed._check_space(100)),
        "fixed_total": fixed._check_space(100),
        "bare": _try(lambda: bare._check_space(100)),
        # on the CPU group the same host tensors are right
        "pre_fix_on_cpu_group": _try(
            lambda: dist.all_reduce(torch.tensor([1], dtype=torch.int64), group=state.cpu_group)
        ),
    }
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier(group=state.cpu_group)


if __name__ == "__main__":
    main()
