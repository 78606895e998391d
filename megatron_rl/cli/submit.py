"""`megatron-rl submit RECIPE [overrides] [--dry-run] [--remote-paths]`: the sbatch command for a
recipe, checked first.

The recipe's cluster group says how many nodes and GPUs per node the job asks for and how long; its
layout says how many ranks it starts. They must agree before anything is queued: a 256-GPU job that
waits hours for its allocation and then dies on a world-size assertion is what this command prevents.
It prints the exact sbatch command (to copy, edit or rerun by hand), then submits it. A recipe whose job
starts its own reward fleet (reward.fleet_nodes without reward.endpoints) becomes a heterogeneous job:
the GPU nodes, then `:` and the fleet's CPU nodes, whole, one reward-server task each
(slurm/train.sbatch starts them and hands the ranks their endpoints). A login node sees
the file system its jobs see, so a path the recipe names that cannot be read here (a mistyped checkpoint
or data path) refuses the submission, naming it; `--remote-paths` says such paths live on storage only
the compute nodes see, and they are noted instead.
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

from megatron_rl.check.recipe import blocking, check_recipe, notes
from megatron_rl.check.seal import SEAL_ENV, seal
from megatron_rl.config.load import REPO_ROOT, RecipeNotFound, load_recipe
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.loop.record.names import ENV as NAME_ENV
from megatron_rl.loop.record.names import checked_name

SCRIPT = REPO_ROOT / "slurm" / "train.sbatch"


@dataclass(frozen=True)
class SlurmRequest:
    """What the job asks Slurm for: one task per GPU on whole nodes."""

    job_name: str
    nodes: int  # the run's nodes (cluster.nodes)
    gpus_per_node: int
    time_limit: str
    partition: str = ""
    account: str = ""
    container_image: str = ""
    # The job's own reward fleet, a second component (0 nodes: none): whole CPU nodes on its partition.
    fleet_nodes: int = 0
    fleet_cpus_per_node: int = 0
    fleet_partition: str = ""
    # Nodes allocated beyond the run's, each ready to replace a node that fails (slurm/train.sbatch).
    spare_nodes: int = 0

    @property
    def tasks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def allocated_nodes(self) -> int:
        return self.nodes + self.spare_nodes


def request_from_recipe(recipe: RecipeConfig) -> SlurmRequest:
    c, r = recipe.cluster, recipe.reward
    own_fleet = r.fleet_nodes if not (r.endpoints or r.endpoints_file) else 0  # else it runs already
    cpus, partition = r.fleet_cpus_per_node, r.fleet_partition
    return SlurmRequest(
        job_name=recipe.name,
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        time_limit=c.time_limit,
        partition=c.partition,
        account=c.account,
        container_image=c.container_image,
        fleet_nodes=own_fleet,
        fleet_cpus_per_node=cpus if own_fleet else 0,
        fleet_partition=partition if own_fleet else "",
        spare_nodes=c.spare_nodes,
    )


def sbatch_command(
    req: SlurmRequest,
    recipe_arg: str,
    overrides: list[str],
    log_dir: str = "logs",
    extra: list[str] | None = None,
    cwd: Path | None = None,
    run_name: str = "",
) -> list[str]:
    """The sbatch argv: the request as flags (they override the script's #SBATCH defaults), then the script
    with the recipe and overrides, which the script hands to every rank. `run_name` (MEGATRON_RL_RUN_NAME)
    is exported by name, so the printed command carries it and a site that exports nothing by default
    still names the run: the job continues the run of that name (loop/record/names.py). With a fleet,
    its component follows a `:` (the script's #SBATCH lines and `extra` apply to the first component)."""
    cwd = Path.cwd() if cwd is None else cwd
    cmd = [
        "sbatch",
        f"--job-name={req.job_name}",
        f"--nodes={req.allocated_nodes}",
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
    if run_name:
        exports.append(f"{NAME_ENV}={run_name}")
    if cwd.resolve() == REPO_ROOT:
        script = str(SCRIPT.relative_to(REPO_ROOT))
    else:  # the batch script finds the checkout from the submit directory unless told
        script = str(SCRIPT)
        exports.append(f"MEGATRON_RL_HOME={REPO_ROOT}")
    if exports:
        cmd.append("--export=" + ",".join(["ALL", *exports]))
    cmd += list(extra or [])
    if req.fleet_nodes:
        cmd += [
            ":",
            f"--nodes={req.fleet_nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={req.fleet_cpus_per_node}",
            "--exclusive",
            f"--time={req.time_limit}",
        ]
        cmd += [f"--partition={req.fleet_partition}"] if req.fleet_partition else []
        cmd += [f"--account={req.account}"] if req.account else []
    return [*cmd, script, recipe_arg, *overrides]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="megatron-rl submit",
        description="Check a recipe against the nodes it asks for, print the sbatch command, and submit it.",
    )
    p.add_argument("recipe", help="a shipped recipe name or a path to a recipe YAML")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. cluster.nodes=4 layout.dp=4")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch command, do not submit")
    p.add_argument(
        "--remote-paths",
        action="store_true",
        help="the paths this machine cannot see live on storage only the compute nodes see: note them "
        "instead of refusing (by default a path the job could not read refuses the submission)",
    )
    p.add_argument("--log-dir", default="logs", help="folder of the job logs (default: logs)")
    p.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra sbatch flag, repeatable: --sbatch=--qos=high --sbatch=--dependency=afterok:123",
    )
    return p.parse_args(argv)


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

    # The same check as `validate` and the driver (megatron_rl/check/recipe.py): the layout against the nodes
    # the job asks for included, so nothing is queued that would die on a world-size assertion; and the
    # paths, which a login node sees as its jobs do, unless told they are remote.
    problems = check_recipe(recipe)
    blocked = blocking(problems, recipe, "submit", args.remote_paths)
    if blocked:
        unseen = [p.key for p in blocked if p.kind in ("files", "unknown")]
        # `validate` refuses them too, but for the paths of a GPU cluster's recipe, which it only notes.
        also = " (megatron-rl validate)" if blocking(problems, recipe, "validate") else ""
        print(f"refused: recipe {recipe.name!r} was not submitted{also}:", file=sys.stderr)
        print("\n".join(f"  - {p}" for p in blocked), file=sys.stderr)
        if unseen:
            print(
                f"this machine cannot see {', '.join(unseen)}, and the job would fail when it starts: fix "
                "the paths (a relative path in a recipe file is read from the file's folder, one on the "
                "command line from the current directory), or pass --remote-paths if they live on storage "
                "only the compute nodes see",
                file=sys.stderr,
            )
        return 1
    for line in notes(problems, "validate", blocked):
        print(line, file=sys.stderr)

    try:  # honoured: the job continues the run of that name (its checkpoints, its W&B run)
        name = checked_name(os.environ[NAME_ENV]) if os.environ.get(NAME_ENV) else ""
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    request = request_from_recipe(recipe)
    cmd = sbatch_command(request, args.recipe, args.overrides, args.log_dir, args.sbatch, run_name=name)
    print(shlex.join(cmd), flush=True)
    print(name_note(recipe, name), file=sys.stderr)
    c = recipe.cluster
    if c.spare_nodes:
        print(
            f"nodes: the run on {c.nodes}, {c.spare_nodes} spare (cluster.spare_nodes): a node that fails is "
            f"replaced inside the job, up to {c.max_restarts} restart(s) (cluster.max_restarts)",
            file=sys.stderr,
        )
    if args.dry_run:
        return 0
    if shutil.which("sbatch") is None:
        print(
            "error: sbatch is not on PATH (run this on a Slurm login node, or use --dry-run)", file=sys.stderr
        )
        return 2
    os.makedirs(args.log_dir, exist_ok=True)  # Slurm cannot open a log in a missing folder
    env = dict(os.environ)
    # Checked in full here, the problem set included: the ranks trust it (check/seal.py). The fleet's
    # endpoints ("launch") are the job's to provide.
    if not [p for p in problems if p.kind != "launch"]:
        env[SEAL_ENV] = seal(recipe)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        print(f"error: sbatch failed with exit code {done.returncode}", file=sys.stderr)
        return done.returncode
    m = re.search(r"Submitted batch job (\d+)", done.stdout)
    if not m:
        print(f"error: cannot read the job id from sbatch's output: {done.stdout.strip()!r}", file=sys.stderr)
        return 1
    job = m.group(1)
    print(
        f"submitted job {job}; log {args.log_dir}/{recipe.name}-{job}.log; run {name or f'{recipe.name}-{job}'}",
        flush=True,
    )
    return 0


def name_note(recipe: RecipeConfig, name: str) -> str:
    """One line on what the job's run will be: the named run continued, or a run of its own."""
    ckpt = Path(recipe.checkpoint.dir)
    resume = recipe.checkpoint.resume
    if name and resume == "auto":
        return (
            f"run {name} ({NAME_ENV}): continues from its newest checkpoint in {ckpt / name}/ when it has one"
        )
    if name:
        return f"run {name} ({NAME_ENV}), checkpoint.resume={resume}"
    return (
        f"run {recipe.name}-<job id>: a run of its own; {NAME_ENV}={recipe.name} makes it continue the local "
        "run of this recipe"
    )
