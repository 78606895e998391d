"""torchrun worker (TP2): real megatron-core checkpoints for the integrity tests.

    torchrun --nproc-per-node 2 worker_integrity.py save ROOT     # steps 1, 2 async and 3 sync
    torchrun --nproc-per-node 2 worker_integrity.py load ROOT     # resume=auto: which step, which weights
    torchrun --nproc-per-node 2 worker_integrity.py continue ROOT [N] # load step N (1), redo step N+1
    torchrun --nproc-per-node 2 worker_integrity.py nospace ROOT sync|async  # ROOT on a disk too small
    torchrun --nproc-per-node 2 worker_integrity.py batch JOBS.json   # several of the above, one process

Prints one JSON line (rank 0) prefixed with RESULT (for `batch`: {job id: its result}, each job with a
policy of its own, as a process of its own would build it). Weights are compared by their digest per rank.
The optimizer warms up and decays its LR (OPTIM), so an update after a resume equals the
uninterrupted one only if the LR schedule continues where it was saved.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# Warm-up over 2 optimizer steps, then cosine: every one of steps 1..3 has another LR.
OPTIM = dict(lr=1e-3, min_lr=1e-4, lr_schedule="cosine", warmup_steps=2, decay_steps=6)


class _Processes:  # the two fields Checkpointer uses
    def __init__(self, rank: int):
        self.rank, self.is_main = rank, rank == 0


class _Task:  # the prompt stream's state is not part of these checks
    def load_state(self, state) -> None:
        pass


def _weights_digest(policy) -> str:
    from megatron_rl.reshard.checksum import digest

    parts = [digest(p.detach(), "xxh3").hex() for p in policy.model.parameters()]
    return digest(torch.frombuffer(bytearray("".join(parts).encode()), dtype=torch.uint8)).hex()


def _all_digests(policy) -> list[str]:
    out: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, _weights_digest(policy))
    return out


def _train_step(policy, spec, seed: int) -> float:
    """One optimizer step on a seeded batch; returns the LR it used."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, spec.vocab_size, (32,), generator=g).tolist() for _ in range(4)]
    return policy.train_step(seqs, [8] * 4, lambda lp, mb: (-(lp * mb.loss_mask_BT).sum() / 96.0, {}))["lr"]


def main() -> None:
    from megatron_rl.config.load import load_recipe
    from megatron_rl.models.spec import ModelSpec
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.trainer.parallel import init_parallel, launched_world

    state = init_parallel(ParallelLayout.over(launched_world(), 2, 1))
    spec = ModelSpec.from_config(load_recipe("grpo_tiny_cpu").model)
    if sys.argv[1] == "batch":
        jobs = json.loads(Path(sys.argv[2]).read_text())
        result = {job["id"]: run(job["args"], state, spec) for job in jobs}
    else:
        result = run(sys.argv[1:], state, spec)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()


def run(args: list[str], state, spec) -> dict:
    """One job: `args` as on the command line (MODE ROOT [...])."""
    from megatron_rl.checkpoint.integrity import NoSpaceError
    from megatron_rl.checkpoint.resume import find, load
    from megatron_rl.checkpoint.save import Checkpointer
    from megatron_rl.trainer.policy import OptimSettings, Policy

    mode, root = args[0], Path(args[1])
    policy = Policy(spec, state, optim=OptimSettings(**OPTIM), micro_batch_size=2)
    procs = _Processes(dist.get_rank())
    result: dict = {}
    if mode == "save":
        ck = Checkpointer(root, procs, keep_last=5, async_save=True)
        result["lr"] = {}
        for step in (1, 2):
            result["lr"][step] = _train_step(policy, spec, step)
            ck.save(step, policy, None, {"step": step, "world_size": 2, "task": {}})
            result[step] = _all_digests(policy)
        ck.close()
        result["lr"][3] = _train_step(policy, spec, 3)
        Checkpointer(root, procs, keep_last=5, async_save=False).save(
            3, policy, None, {"step": 3, "world_size": 2, "task": {}}
        )
        result[3] = _all_digests(policy)
    elif mode == "load":
        path = find("auto", root)
        result["path"] = str(path) if path else None
        if path is not None:
            _train_step(policy, spec, 99)  # the optimizer state must exist to load into it
            result["step"] = load(path, procs.rank, policy, None, _Task())["step"]
            result["digests"] = _all_digests(policy)
    elif mode == "continue":  # resume from step N and take step N+1's optimizer step again
        n = int(args[2]) if len(args) > 2 else 1
        _train_step(policy, spec, 99)  # also advances the schedule: the load must set, not add
        load(root / f"step_{n:06d}", procs.rank, policy, None, _Task())
        result["lr"] = _train_step(policy, spec, n + 1)
        result["digests"] = _all_digests(policy)
    elif mode == "nospace":
        _train_step(policy, spec, 1)
        ck = Checkpointer(root, procs, async_save=args[2] == "async")
        try:
            ck.save(1, policy, None, {"step": 1, "world_size": 2, "task": {}})
            ck.close()
            result["error"] = None
        except NoSpaceError as e:
            result["error"] = str(e)
            result["cause"] = repr(e.__cause__)[:300] if e.__cause__ else None
        every: list = [None] * dist.get_world_size()  # every rank must reach the same verdict
        dist.all_gather_object(every, result["error"], group=state.cpu_group)
        result["errors"] = every
    dist.barrier()
    return result


if __name__ == "__main__":
    main()
