"""Export a checkpoint's policy as an HF safetensors directory: an alias of `megatron-rl export`.

    python tools/export_hf.py RECIPE CHECKPOINT_DIR OUT_DIR [overrides...] [--verbose]
    torchrun --nproc-per-node N tools/export_hf.py RECIPE CHECKPOINT_DIR OUT_DIR [overrides...]

From a plain shell it launches itself on one model replica of the recipe's layout, as `megatron-rl
export` does; under torchrun or srun it is one rank of an export of any world size N (the recipe's
TP/PP, DP from N: dist-checkpointing reshards, e.g. a TP2 checkpoint exported with N=1 and
layout.tp=1). CHECKPOINT_DIR is one step directory (with its COMPLETE marker) or a run's checkpoint
folder (the newest complete step). The full output goes to OUT_DIR.log (megatron_rl/cli/export.py).
"""

import sys

from megatron_rl.cli.export import entry


def main(argv=None) -> int:
    return entry(argv)


if __name__ == "__main__":
    sys.exit(main())
