"""Export a checkpoint's policy as an HF safetensors folder (what `transformers` and vLLM load).

    megatron-rl export RECIPE CHECKPOINT OUT [overrides...] [--verbose]

CHECKPOINT is one step directory (with its COMPLETE marker) or a run's checkpoint folder (its newest
complete step). From a plain shell the command launches itself, like `megatron-rl run`: it checks the
recipe and finds the checkpoint first (a bad one fails in a second, not after the processes start),
then starts torchrun on this machine with one process per rank of a single model replica of the
recipe's layout (TP x PP x CP, times the DP that expert parallelism needs): every rank of an export
gathers its shards to rank 0, so more DP replicas would only repeat the work. Dist-checkpointing
reshards, so the checkpoint loads at any layout the recipe could run (overrides, as `validate` judges
them: `layout.tp=1 layout.pp=2` exports a TP2 checkpoint from two pipeline stages); under torchrun,
`tools/export_hf.py` takes the recipe's TP/PP and DP from any world size. The checkpoint is verified
against its manifest before anything reads it (sizes here, every byte by the ranks).

The terminal gets one line before and one after (what is exported, from where, to where; then the
files); library warnings and every rank's output go to OUT.log beside the folder (`--verbose` or
MEGATRON_RL_VERBOSE=1 shows them too). Exit 0 exported, 1 refused (a bad recipe, no complete
checkpoint, one that does not verify, a rank that failed: its last lines are shown), 2 a GPU cluster's
recipe where CUDA is unavailable.

A subcommand rather than only `tools/export_hf.py`: exporting is a step of every run's life, so it
belongs with `run`, `report` and `ckpt verify` on the installed command line (any directory, no
checkout), launched and checked the same way. `tools/export_hf.py` stays as a thin alias: under
torchrun or srun it is one rank, as before; from a plain shell it launches itself (`entry` below).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from megatron_rl.parallel.dist_env import from_env
from megatron_rl.parallel.layout import ParallelLayout

USAGE = "megatron-rl export RECIPE CHECKPOINT OUT [overrides...] [--verbose]"


def replica_layout(layout: ParallelLayout) -> ParallelLayout:
    """The fewest ranks that hold one whole copy of the recipe's model: its TP x PP x CP, and the DP
    that expert parallelism needs (megatron-core carves EP x ETP out of a stage's TP x CP x DP ranks)."""
    experts = layout.ep * layout.etp
    dp = experts // math.gcd(experts, layout.tp * layout.cp)
    return layout.with_(dp=dp)


def log_path(out: str | Path) -> Path:
    """Where an export's full output goes: OUT.log beside the folder (not inside it: the folder is what
    gets uploaded or served, and a checkpoint's folder is sealed by its manifest)."""
    out = Path(out).resolve()
    return out.with_name(out.name + ".log")


def step_dir(checkpoint: str | Path) -> Path:
    """The step directory to export: CHECKPOINT itself when complete, else its newest complete step."""
    from megatron_rl.checkpoint.store import is_complete, newest_complete

    path = Path(checkpoint)
    if is_complete(path):
        return path
    found = newest_complete(path)
    if found is None:
        raise FileNotFoundError(
            f"no complete checkpoint at {path} (a step_N directory with its COMPLETE marker)"
        )
    return found[1]


def _split(argv: list[str]) -> tuple[list[str], bool]:
    verbose = "--verbose" in argv
    return [a for a in argv if a != "--verbose"], verbose


def main(argv: list[str] | None = None) -> int:
    """`megatron-rl export`: check, then launch the ranks under torchrun on this machine."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    argv, verbose = _split(argv)
    if len(argv) < 3:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    recipe_name, checkpoint, out, overrides = argv[0], argv[1], argv[2], argv[3:]
    from megatron_rl.check.recipe import checked, refused
    from megatron_rl.checkpoint.integrity import verify
    from megatron_rl.cli.launch_local import ready_here, torchrun_here
    from megatron_rl.cli.launch_torchrun import LOG_ENV
    from megatron_rl.config.load import RecipeError, RecipeNotFound, load_recipe
    from megatron_rl.config.problem import ConfigError

    try:
        recipe = load_recipe(recipe_name, overrides)
        refusal = ready_here(recipe)  # as `megatron-rl run`: the GPU-cluster rule, the CPU demo's checkpoint
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2  # the GPU-cluster rule's exit code everywhere (system/device.py)
        # The planner's kinds of problem: the model's shape and the layout rules. The data, the memory
        # of training and what only the driver lacks do not concern an export.
        found, run = checked(recipe, read_data=False)
        problems = refused(found, "plan")
        if problems or run is None:
            raise ConfigError(problems or found, recipe.name)
        step = step_dir(checkpoint)
        # Sizes and names only, here; the ranks share the re-hashing of every byte before reading any.
        problems = verify(step, full=False)
        if problems:
            raise FileNotFoundError(f"{step} does not verify: {'; '.join(problems[:5])}")
    except (ConfigError, RecipeError, RecipeNotFound, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    log = log_path(out)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")  # this export's output only (the ranks append)
    nproc = replica_layout(run.layout).trainer_world
    cmd = torchrun_here(nproc, "megatron_rl.cli.export", recipe_name, str(step), out, *overrides)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), LOG_ENV: str(log)}
    if verbose:
        env["MEGATRON_RL_VERBOSE"] = "1"
    return subprocess.call(cmd, env=env)


def _export(recipe_name: str, checkpoint: str, out: str, overrides: list[str]) -> int:
    """One rank's export (every rank of the launched world runs it); its output is already in the log."""
    from megatron_rl.checkpoint.resume import verify_shared
    from megatron_rl.config.load import load_recipe
    from megatron_rl.run import resolve
    from megatron_rl.telemetry.console import active

    console = active()
    ckpt = step_dir(checkpoint)
    recipe = load_recipe(recipe_name, overrides)
    run = resolve(recipe)  # the layout and the model's shape (its checkpoint's config.json), once
    dist_env = from_env()
    world = dist_env.world_size
    lay = run.layout
    # Any world size N loads it: the recipe's TP/PP/CP, DP from N (dist-checkpointing reshards).
    lay = lay.with_(dp=max(1, world // (lay.tp * lay.pp * lay.cp)), engine_count=world)
    if dist_env.rank == 0 and console is not None:
        console.say(
            f"megatron-rl export {recipe.name}: {ckpt} -> {out} on {world} "
            f"{'process' if world == 1 else 'processes'} (trainer TP{lay.tp} PP{lay.pp} DP{lay.dp}); "
            f"full output in {console.log_path}"
        )
    from megatron.core import dist_checkpointing

    from megatron_rl.checkpoint.export import write_hf
    from megatron_rl.trainer.build import build_policy
    from megatron_rl.trainer.gather import full_state
    from megatron_rl.trainer.parallel import destroy_parallel, init_parallel

    state = init_parallel(lay, seed=recipe.seed)
    try:
        # Verified before any DCP read: torch's reader unpickles dist/.metadata (checkpoint/integrity.py).
        problems = verify_shared(ckpt, state.cpu_group)
        if problems:
            raise ValueError(f"{ckpt} does not verify: {'; '.join(problems[:5])}")
        # The shape comes from the recipe (its checkpoint's config.json); the weights from our checkpoint.
        policy = build_policy(run, state, with_optimizer=False, import_weights=False)
        loaded = dist_checkpointing.load({"model": policy.model.sharded_state_dict()}, str(ckpt / "dist"))
        policy.model.load_state_dict(loaded["model"])
        written = write_hf(full_state(policy), policy.spec, out, source=recipe.model.hf_checkpoint)
    finally:
        destroy_parallel()
    if written is not None:
        files = ", ".join(sorted(p.name for p in written.iterdir() if p.is_file()))
        line = f"exported {ckpt} -> {written}: {files}"
        if console is None:
            print(line)
        else:
            console.say(line)
    return 0


def rank_main(argv: list[str] | None = None) -> int:
    """One rank under torchrun or srun: output into the log (OUT.log, or the launcher's), errors on the
    terminal, exit 1 on any error."""
    import argparse

    from megatron_rl.cli.launch_torchrun import LOG_ENV
    from megatron_rl.telemetry import console

    argv, verbose = _split(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="megatron-rl export", usage=USAGE)
    p.add_argument("recipe")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if verbose:
        os.environ[console.VERBOSE_ENV] = "1"
    # Before megatron-core loads: its import warnings go to the log from the first line.
    console.start(Path(os.environ.get(LOG_ENV) or log_path(args.out)), from_env().rank)
    return console.run_guarded(lambda: _export(args.recipe, args.checkpoint, args.out, args.overrides))


def launched() -> bool:
    """Under torchrun or srun (a rank), as opposed to a plain shell (parallel/dist_env.py decides)."""
    return from_env().launcher != "single"


def entry(argv: list[str] | None = None) -> int:
    """`python -m megatron_rl.cli.export` and `tools/export_hf.py`: a rank when launched, else the
    launcher (which starts this module again, as the ranks)."""
    return rank_main(argv) if launched() else main(argv)


if __name__ == "__main__":
    sys.exit(entry())
