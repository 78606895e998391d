"""torchrun worker: load a checkpoint at the recipe's layout (maybe not the saved one), export HF,
and write the trainer's log-probs on fixed sequences for the test to compare with transformers.

    torchrun --nproc-per-node 2 worker_export.py CKPT_STEP_DIR OUT_DIR [overrides...]
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    from megatron.core import dist_checkpointing

    from megatron_rl.checkpoint.export import write_hf
    from megatron_rl.config.load import load_recipe
    from megatron_rl.run import resolve
    from megatron_rl.trainer.build import build_policy
    from megatron_rl.trainer.gather import full_state
    from megatron_rl.trainer.parallel import init_parallel

    ckpt, out, overrides = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    run = resolve(load_recipe("grpo_tiny_cpu", overrides))
    state = init_parallel(run.layout, seed=run.recipe.seed)
    policy = build_policy(run, state, with_optimizer=False)
    loaded = dist_checkpointing.load({"model": policy.model.sharded_state_dict()}, str(ckpt / "dist"))
    policy.model.load_state_dict(loaded["model"])
    write_hf(full_state(policy), policy.spec, out / "hf")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 17, (n,), generator=g).tolist() for n in (7, 11, 9, 5) * 4]
    plens = [3, 4, 2, 2] * 4  # 16 sequences: the recipe's micro-batch size
    lps = policy.logprobs(seqs, plens, temperature=1.0)
    if dist.get_rank() == 0:
        torch.save({"seqs": seqs, "plens": plens, "logprobs": lps}, out / "trainer_logprobs.pt")
    dist.barrier()


if __name__ == "__main__":
    main()
