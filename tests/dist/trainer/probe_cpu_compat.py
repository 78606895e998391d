"""Runs megatron-core's CUDA-assuming paths on CPU with a chosen set of patches; prints the stage reached.

  python probe_cpu_compat.py PATCHES   (comma list or 'all'; 'none' for no patches)
Prints 'STAGE <name> ok' per stage and 'FAILED <stage> <error>' at the first failure.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29561")  # the test sets a free port

from megatron_rl.trainer import cpu_compat  # noqa: E402


def ok(name):
    print(f"STAGE {name} ok", flush=True)


def main() -> None:
    which = sys.argv[1]
    only = None if which == "all" else ([] if which == "none" else which.split(","))
    cpu_compat.apply_cpu_patches(only=only)
    stage = "init"
    try:
        dist.init_process_group("gloo")
        from megatron.core import parallel_state as ps

        ps.initialize_model_parallel(1, 1)
        stage = "seed"  # model_parallel_cuda_manual_seed -> CudaRNGStatesTracker.add
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1)
        ok(stage)
        stage = "build"
        from megatron_rl.parallel.dist_env import from_env
        from megatron_rl.parallel.layout import ParallelLayout
        from megatron_rl.trainer.parallel import ParallelState
        from megatron_rl.trainer.policy import OptimSettings, Policy
        from tests.helpers.specs import QWEN2_TINY

        st = ParallelState(env=from_env(), layout=ParallelLayout(), device=torch.device("cpu"))
        pol = Policy(QWEN2_TINY, st, optim=OptimSettings(lr=1e-3, clip_grad=1.0))
        ok(stage)
        stage = "forward"  # DotProductAttention -> rng tracker fork; schedules -> device='cuda'
        seqs, pls = [[1, 2, 3, 4, 5, 6]], [2]
        pol.logprobs(seqs, pls)
        ok(stage)
        stage = "optimizer"  # clip_grads / distrib_optimizer type() checks
        pol.train_step(seqs, pls, lambda lp, mb: (-(lp * mb.loss_mask_BT).sum(), {}))
        ok(stage)
        stage = "dist_checkpointing"  # torch.cuda.synchronize in the loaders
        from megatron.core import dist_checkpointing

        d = tempfile.mkdtemp()
        dist_checkpointing.save(pol.model.sharded_state_dict(), d)
        dist_checkpointing.load(pol.model.sharded_state_dict(), d)
        ok(stage)
        stage = "optimizer_checkpoint"  # resume of torch Adam state through the distributed optimizer
        from megatron_rl.checkpoint.save import sharded_state

        d2 = tempfile.mkdtemp()
        dist_checkpointing.save(sharded_state(pol), d2)
        loaded = dist_checkpointing.load(sharded_state(pol, loading=True), d2)
        pol.optimizer.load_state_dict(loaded["optimizer"])
        ok(stage)
        stage = "event"  # megatron.core.inference text_generation_controller times with torch.cuda.Event
        import inspect

        import megatron.core.inference.text_generation_controllers.text_generation_controller as tgc

        assert "torch.cuda.Event" in inspect.getsource(tgc), (
            "megatron inference no longer uses torch.cuda.Event"
        )
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        b.record()
        b.synchronize()
        assert a.elapsed_time(b) >= 0
        ok(stage)
        stage = "moe"  # the MoE router's gating matmul (moe_utils.te_general_gemm)
        from dataclasses import replace

        moe = replace(QWEN2_TINY, family="qwen3_moe", num_experts=4, moe_ffn_hidden_size=64, moe_topk=2)
        Policy(moe, st).logprobs(seqs, pls)
        ok(stage)
        print("ALL OK", flush=True)
    except BaseException as e:  # noqa: BLE001 - report any failure as data for the test
        print(f"FAILED {stage} {type(e).__name__}: {str(e)[:300]}", flush=True)


# dist_checkpointing starts a spawn Manager that re-imports this file: guard the entry point.
if __name__ == "__main__":
    main()
