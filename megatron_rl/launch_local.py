"""Launch a recipe on this machine: torchrun with one process per (stand-in) GPU.

    python -m megatron_rl.launch_local RECIPE [overrides...]

Validates the recipe first (so a bad one fails in a second, not after the processes start), sizes
the torchrun from the recipe's layout, picks a free port, and sets OMP_NUM_THREADS=1 (vLLM's CPU
build runs ~15x slower without it). The exit code is torchrun's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from megatron_rl.config.load import load_recipe
from megatron_rl.config.validate import ConfigError, validate_recipe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    recipe_name, overrides = argv[0], argv[1:]
    try:
        recipe = validate_recipe(load_recipe(recipe_name, overrides))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    lay = recipe.layout
    nproc = lay.tp * lay.pp * lay.dp * lay.cp
    if lay.placement == "separated":
        nproc += lay.engine_tp * lay.engine_count
    if recipe.cluster.nodes != 1:
        print(
            f"error: {recipe.name} needs {recipe.cluster.nodes} nodes; launch it with `megatron-rl submit`",
            file=sys.stderr,
        )
        return 1
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "-m",
        "megatron_rl.train",
        recipe_name,
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print("+ " + " ".join(cmd[2:]), file=sys.stderr)
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
