"""Check a launch in seconds before spending a long allocation on it.

    MEGATRON_RL_ENTRY=launch/check_dist.py sbatch slurm/train.sbatch RECIPE [overrides]
    MEGATRON_RL_ENTRY=launch/check_dist.py launch/torchrun.sh RECIPE [overrides]

Every rank joins the process group (NCCL with GPUs, gloo without), runs an all_reduce whose result
only a correct rank numbering gives, and reports where it landed. Rank 0 prints one line
`CHECK_DIST {json}` with every rank's view (rank, local rank, host, GPU, Slurm job) and, when a recipe
is given, compares the world size with the recipe's layout. Exit status: 0 when all agree.

MEGATRON_RL_CHECK_WAIT_USR1=S: then wait up to S seconds for SIGUSR1 (what `--signal=USR1@120` sends
before the time limit) and report whether every rank received it.

Shapes: W = world size.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta


def recipe_layout(recipe_args: list[str]):
    from megatron_rl.config.load import load_recipe
    from megatron_rl.parallel.layout import ParallelLayout

    recipe = load_recipe(recipe_args[0], recipe_args[1:])
    return ParallelLayout.from_config(recipe.layout)


def expected_world(recipe_args: list[str]) -> int:
    """Processes the recipe's layout needs (colocated: the trainer's; separated: trainer + engines)."""
    return recipe_layout(recipe_args).world_size


def roles(recipe_args: list[str], world: int) -> list[str]:
    """What each rank would be in the recipe's run: "trainer+engine" (colocated), or "trainer" / "engine"
    (separated: the trainer's ranks first, then the engines'; loop/placement/pools.py)."""
    lay = recipe_layout(recipe_args)
    if lay.colocated:
        return ["trainer+engine"] * world
    return ["trainer" if lay.is_trainer(r) else "engine" for r in range(world)]


def usr1_catcher() -> list[float]:
    """Record SIGUSR1 arrival times (since now) instead of dying of it. Installed before anything else, so
    a signal that comes early is counted, not fatal."""
    got: list[float] = []
    t0 = time.monotonic()
    signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(time.monotonic() - t0))
    return got


def main(argv: list[str]) -> int:
    wait_s = float(os.environ.get("MEGATRON_RL_CHECK_WAIT_USR1", "0") or 0)
    usr1 = usr1_catcher() if wait_s > 0 else []
    import torch
    import torch.distributed as dist

    from megatron_rl.parallel.dist_env import from_env

    env = from_env()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu_group = dist.new_group(backend="gloo")
    device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")

    # Each rank marks its own slot: the sum is all ones only if the ranks are exactly 0..world-1, once each.
    slots_W = torch.zeros(world, dtype=torch.int32, device=device)
    slots_W[rank] = 1
    dist.all_reduce(slots_W)
    view = {
        "rank": rank,
        "env_rank": env.rank,
        "world": world,
        "local_rank": env.local_rank,
        "local_world": env.local_world_size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "master": f"{env.master_addr}:{env.master_port}",
        "slurm_procid": os.environ.get("SLURM_PROCID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": torch.cuda.get_device_name(env.local_rank) if cuda else "cpu",
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_job_name": os.environ.get("SLURM_JOB_NAME"),
        "run_name": os.environ.get("MEGATRON_RL_RUN_NAME"),  # the run the job continues, when named
        "all_reduce_ok": bool((slots_W == 1).all()),
    }
    if wait_s > 0:
        print(f"rank {rank}: waiting up to {wait_s:g} s for SIGUSR1", flush=True)
        deadline = time.monotonic() + wait_s
        while not usr1 and time.monotonic() < deadline:
            time.sleep(0.1)
        view["usr1_after_s"] = round(usr1[0], 2) if usr1 else None
        print(f"rank {rank}: SIGUSR1 " + (f"after {usr1[0]:.1f} s" if usr1 else "not received"), flush=True)
    views: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(views, view, group=cpu_group)  # host objects: gloo, on GPU too

    problems = [f"rank {v['rank']}: all_reduce gave a wrong sum" for v in views if not v["all_reduce_ok"]]
    problems += [
        f"rank {v['rank']}: launcher says rank {v['env_rank']}" for v in views if v["env_rank"] != v["rank"]
    ]
    problems += [
        f"rank {v['rank']}: no SIGUSR1 within {wait_s} s" for v in views if v.get("usr1_after_s", 0) is None
    ]
    if rank == 0:
        report = {"world": world, "ranks": views}
        if argv:
            need = expected_world(argv)
            report["recipe_world"] = need
            report["roles"] = roles(argv, world)
            if need != world:
                problems.append(f"the recipe's layout needs {need} processes, the launch started {world}")
        report["problems"] = problems
        print("CHECK_DIST " + json.dumps(report, sort_keys=True), flush=True)
        for p in problems:
            print(f"check_dist: {p}", file=sys.stderr, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
