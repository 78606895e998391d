"""Export a checkpoint's policy as an HF safetensors directory.

    torchrun --nproc-per-node N tools/export_hf.py RECIPE CHECKPOINT_DIR OUT_DIR [overrides...]

CHECKPOINT_DIR is one step directory (with its COMPLETE marker) or a run's checkpoint folder (the
newest complete step is used). Any layout whose world size is N can load it (dist-checkpointing
reshards), e.g. a TP2 checkpoint exported with N=1 and layout.tp=1.
"""

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recipe")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)

    from megatron.core import dist_checkpointing

    from megatron_rl.checkpoint.export import write_hf
    from megatron_rl.checkpoint.store import is_complete, newest_complete
    from megatron_rl.config.load import load_recipe
    from megatron_rl.trainer.build import build_policy
    from megatron_rl.trainer.parallel import destroy_parallel, init_parallel, launched_world

    ckpt = Path(args.checkpoint)
    if not is_complete(ckpt):
        found = newest_complete(ckpt)
        if found is None:
            print(f"error: no complete checkpoint at {ckpt}", file=sys.stderr)
            return 1
        ckpt = found[1]
    from megatron_rl.run import resolve

    recipe = load_recipe(args.recipe, args.overrides)
    run = resolve(recipe)  # the layout and the model's shape (its checkpoint's config.json), once
    # Any world size N can load it: the recipe's TP/PP (and CP), DP from N (dist-checkpointing reshards).
    lay = run.layout
    lay = lay.with_(dp=max(1, launched_world() // (lay.tp * lay.pp * lay.cp)), engine_count=launched_world())
    state = init_parallel(lay, seed=recipe.seed)
    # Verified before any DCP read: torch's reader unpickles dist/.metadata (checkpoint/integrity.py).
    from megatron_rl.checkpoint.resume import verify_shared

    problems = verify_shared(ckpt, state.cpu_group)
    if problems:
        print(f"error: {ckpt} does not verify: {'; '.join(problems[:5])}", file=sys.stderr)
        destroy_parallel()
        return 1
    # The shape comes from the recipe (its checkpoint's config.json); the weights from our checkpoint.
    policy = build_policy(run, state, with_optimizer=False, import_weights=False)
    loaded = dist_checkpointing.load({"model": policy.model.sharded_state_dict()}, str(ckpt / "dist"))
    policy.model.load_state_dict(loaded["model"])
    out = write_hf(policy, args.out, source=recipe.model.hf_checkpoint)
    if out is not None:
        print(f"exported {ckpt} -> {out}")
    destroy_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
