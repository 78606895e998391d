"""`megatron-rl submit RECIPE [overrides] [--dry-run]`: the sbatch command for a recipe, checked first.

The recipe's cluster group says how many nodes and GPUs per node the job asks for and how long; its
layout says how many ranks it starts. They must agree before anything is queued: a 256-GPU job that
waits hours for its allocation and then dies on a world-size assertion is what this command prevents.
It prints the exact sbatch command (to copy, edit or rerun by hand), then submits it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from megatron_rl.config.load import REPO_ROOT, RecipeNotFound, load_recipe
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.layout import ParallelLayout

SCRIPT = REPO_ROOT / "slurm" / "train.sbatch"
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (or no limit).
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")


@dataclass(frozen=True)
class SlurmRequest:
    """What the job asks Slurm for: one task per GPU on whole nodes."""

    job_name: str
    nodes: int
    gpus_per_node: int
    time_limit: str
    partition: str = ""
    account: str = ""
    container_image: str = ""

    @property
    def tasks(self) -> int:
        return self.nodes * self.gpus_per_node


def request_from_recipe(recipe: RecipeConfig) -> SlurmRequest:
    c = recipe.cluster
    return SlurmRequest(
        job_name=recipe.name,
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        time_limit=c.time_limit,
        partition=c.partition,
        account=c.account,
        container_image=c.container_image,
    )


def _describe(lay) -> str:
    trainer = f"trainer tp{lay.tp} x pp{lay.pp} x dp{lay.dp} x cp{lay.cp}"
    engines = f"{lay.engine_count} engine(s) of tp{lay.engine_tp}"
    if lay.placement == "colocated":
        return f"{trainer}, {engines} on the same ranks"
    return f"{trainer} + {engines} on their own GPUs"


def fit_problems(recipe: RecipeConfig) -> list[str]:
    """Why the recipe's layout does not fit the nodes it asks for (empty list: it fits)."""
    lay, c = recipe.layout, recipe.cluster
    if c.nodes < 1 or c.gpus_per_node < 1:
        return [f"cluster.nodes={c.nodes} and cluster.gpus_per_node={c.gpus_per_node} must both be >= 1"]
    out: list[str] = []
    layout = ParallelLayout.from_config(lay)
    gpus = c.nodes * c.gpus_per_node
    if layout.world_size != gpus:
        if layout.world_size % c.gpus_per_node == 0:
            fix = f"set cluster.nodes={layout.world_size // c.gpus_per_node}, or resize the layout to {gpus} ranks"
        else:
            fix = f"resize the layout (e.g. layout.dp) to fill whole nodes of {c.gpus_per_node} GPUs"
        out.append(
            f"the layout starts {layout.world_size} ranks ({_describe(lay)}) but the job asks for "
            f"cluster.nodes={c.nodes} x cluster.gpus_per_node={c.gpus_per_node} = {gpus} GPUs, one rank each; {fix}"
        )
    if lay.placement == "colocated" and layout.engine_world > layout.trainer_world:
        out.append(
            f"layout.engine_tp x layout.engine_count = {layout.engine_world} engine ranks exceed the "
            f"{layout.trainer_world} ranks they are colocated on"
        )
    if lay.placement != "colocated" and lay.engine_gpus and lay.engine_gpus != layout.engine_world:
        out.append(
            f"layout.engine_gpus={lay.engine_gpus} but engine_tp x engine_count = {layout.engine_world}; "
            "make them equal"
        )
    for key, size in (("layout.tp", lay.tp), ("layout.engine_tp", lay.engine_tp)):
        if size > c.gpus_per_node or c.gpus_per_node % size:
            out.append(
                f"{key}={size} does not fit inside one node of {c.gpus_per_node} GPUs: tensor-parallel groups "
                f"all-reduce every layer and must stay on a node's NVLink; use a divisor of {c.gpus_per_node}"
            )
    if not _TIME.match(c.time_limit):
        out.append(
            f"cluster.time_limit={c.time_limit!r} is not a Slurm time; use e.g. 48:00:00, 2-00:00:00 or 90 (minutes)"
        )
    return out


def sbatch_command(
    req: SlurmRequest,
    recipe_arg: str,
    overrides: list[str],
    log_dir: str = "logs",
    extra: list[str] | None = None,
    cwd: Path | None = None,
) -> list[str]:
    """The sbatch argv: the request as flags (they override the script's #SBATCH defaults), then the script
    with the recipe and overrides, which the script hands to every rank."""
    cwd = Path.cwd() if cwd is None else cwd
    cmd = [
        "sbatch",
        f"--job-name={req.job_name}",
        f"--nodes={req.nodes}",
        f"--gpus-per-node={req.gpus_per_node}",
        f"--ntasks-per-node={req.gpus_per_node}",
        f"--time={req.time_limit}",
    ]
    if req.partition:
        cmd.append(f"--partition={req.partition}")
    if req.account:
        cmd.append(f"--account={req.account}")
    cmd.append(f"--output={log_dir}/%x-%j.log")
    exports = []
    if req.container_image:
        exports.append(f"CONTAINER_IMAGE={req.container_image}")
    if cwd.resolve() == REPO_ROOT:
        script = str(SCRIPT.relative_to(REPO_ROOT))
    else:  # the batch script finds the checkout from the submit directory unless told
        script = str(SCRIPT)
        exports.append(f"MEGATRON_RL_HOME={REPO_ROOT}")
    if exports:
        cmd.append("--export=" + ",".join(["ALL", *exports]))
    cmd += list(extra or [])
    return [*cmd, script, recipe_arg, *overrides]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="megatron-rl submit",
        description="Check a recipe against the nodes it asks for, print the sbatch command, and submit it.",
    )
    p.add_argument("recipe", help="a shipped recipe name or a path to a recipe YAML")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. cluster.nodes=4 layout.dp=4")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch command, do not submit")
    p.add_argument("--log-dir", default="logs", help="folder of the job logs (default: logs)")
    p.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra sbatch flag, repeatable: --sbatch=--qos=high --sbatch=--dependency=afterok:123",
    )
    return p.parse_args(argv)


def _recipe_problems(recipe: RecipeConfig) -> list[str]:
    from megatron_rl.config.validate import check_recipe

    return [str(p) for p in check_recipe(recipe)]


def main(argv: list[str]) -> int:
    args = _parse(argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except RecipeNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Hydra/OmegaConf: unknown key, wrong type, missing group option
        print(f"error: recipe {args.recipe!r} does not compose: {e}", file=sys.stderr)
        return 2

    fit, other = fit_problems(recipe), _recipe_problems(recipe)
    if fit or other:
        print(f"refused: recipe {recipe.name!r} was not submitted", file=sys.stderr)
        if fit:
            print("its layout does not fit the requested nodes:", file=sys.stderr)
            print("\n".join(f"  - {p}" for p in fit), file=sys.stderr)
        if other:
            print("recipe problems (megatron-rl validate):", file=sys.stderr)
            print("\n".join(f"  - {p}" for p in other), file=sys.stderr)
        return 1

    cmd = sbatch_command(request_from_recipe(recipe), args.recipe, args.overrides, args.log_dir, args.sbatch)
    print(shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    if shutil.which("sbatch") is None:
        print(
            "error: sbatch is not on PATH (run this on a Slurm login node, or use --dry-run)", file=sys.stderr
        )
        return 2
    os.makedirs(args.log_dir, exist_ok=True)  # Slurm cannot open a log in a missing folder
    done = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        print(f"error: sbatch failed with exit code {done.returncode}", file=sys.stderr)
        return done.returncode
    m = re.search(r"Submitted batch job (\d+)", done.stdout)
    if not m:
        print(f"error: cannot read the job id from sbatch's output: {done.stdout.strip()!r}", file=sys.stderr)
        return 1
    job = m.group(1)
    print(f"submitted job {job}; log {args.log_dir}/{recipe.name}-{job}.log", flush=True)
    return 0
