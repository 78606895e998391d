"""Launch a recipe on this machine: torchrun with one process per (stand-in) GPU.

    megatron-rl run RECIPE [overrides...] [--verbose]      (= python -m megatron_rl.cli.launch_local ...)

Validates the recipe first (so a bad one fails in a second, not after the processes start), refuses a
GPU cluster where CUDA is unavailable (exit 2, megatron_rl/system/device.py's rule), sizes
the torchrun from the recipe's layout, picks a free port, and sets OMP_NUM_THREADS=1 (vLLM's CPU
build runs ~15x slower without it). The exit code is that of the first rank that failed, or 0.

The ranks keep the terminal quiet (a header, the progress bar, our warnings, errors and the closing
summary) and write everything into `<run dir>/log.txt`; `--verbose` (or MEGATRON_RL_VERBOSE=1) shows
every line on the terminal too. When the run fails, the last lines of log.txt from the rank that failed
first are shown (cli/launch_torchrun.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from megatron_rl.check.recipe import ConfigError, validate_recipe
from megatron_rl.check.seal import SEAL_ENV, seal
from megatron_rl.cli.launch_torchrun import LOG_ENV
from megatron_rl.config.load import RecipeError, RecipeNotFound, load_recipe
from megatron_rl.system.device import refusal_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready_here(recipe) -> str | None:
    """Before a recipe's ranks start on this machine (`megatron-rl run`, `export`): the refusal of a GPU
    cluster where CUDA is unavailable (the driver's rule, system/device.py), else None once the CPU
    demo's checkpoint (model.fixture) is built (once; models/fixture.py)."""
    refusal = refusal_for(recipe.cluster)
    if refusal is None and recipe.model.fixture and recipe.model.hf_checkpoint:
        from megatron_rl.models.fixture import build_fixture

        build_fixture(recipe.model.fixture, Path(recipe.model.hf_checkpoint))
    return refusal


def torchrun_here(nproc: int, module: str, *args: str) -> list[str]:
    """The command that runs `python -m module args` as `nproc` ranks on this machine (a free local
    port; launch_torchrun prints a short summary when a rank fails): `megatron-rl run` and `export`."""
    return [
        sys.executable,
        "-m",
        "megatron_rl.cli.launch_torchrun",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "-m",
        module,
        *args,
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    recipe_name, overrides = argv[0], argv[1:]
    try:
        recipe = load_recipe(recipe_name, overrides)
        refusal = ready_here(recipe)
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
        run = validate_recipe(recipe)  # the driver's own check, before any process starts
    except (ConfigError, RecipeError, RecipeNotFound, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    nproc = run.layout.gpus
    if recipe.cluster.nodes != 1:
        print(
            f"error: {recipe.name} needs {recipe.cluster.nodes} nodes; launch it with `megatron-rl submit`",
            file=sys.stderr,
        )
        return 1
    cmd = torchrun_here(nproc, "megatron_rl.train", recipe_name, *overrides)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if verbose:
        env["MEGATRON_RL_VERBOSE"] = "1"
        print("+ " + " ".join(cmd[2:]), file=sys.stderr)
    # Every rank must agree on the run directory (log.txt lives there): fix the name once, here.
    from megatron_rl.loop.record.names import run_name

    try:
        env["MEGATRON_RL_RUN_NAME"] = run_name(recipe, env)
    except ValueError as e:  # a name that cannot be one folder: said before any rank starts
        print(f"error: {e}", file=sys.stderr)
        return 2
    # launch_torchrun shows the failed rank's last lines from here (errors from C code or a rank killed
    # by a signal never pass through our handlers).
    env[LOG_ENV] = str(Path(recipe.logger.run_dir) / env["MEGATRON_RL_RUN_NAME"] / "log.txt")
    # The ranks check the recipe again but trust this check's read of the problem set (check/seal.py)
    env[SEAL_ENV] = seal(recipe)
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
