"""The one check of a recipe: whatever the driver would refuse, every command refuses first.

`validate`, `submit`, `launch_local`, the planner and the driver (`train.py`, before it builds
anything) call `check_recipe`; each refuses the kinds of problem that concern it
(config/problem.py): the planner skips layouts the driver cannot run yet and memory it will show
anyway; a path this machine cannot read is refused where the job will read it from here (`validate`
of a recipe for this machine, `submit` from a login node unless told the paths are remote: `blocking`)
and noted elsewhere, and the driver refuses it before it builds anything.

Hydra's structured configs refuse unknown keys and wrong types. This module adds what they cannot
see: every number's range and the enumerations (check/ranges.py), paths, end ids and prompt lengths
read from this machine (check/files.py), the rules between keys (check/rules.py: the layout against
the model and the cluster, batch and length arithmetic, the sampling convention, publication settings)
and the memory fit. All problems are collected, so a user fixes a recipe in one pass. As it checks, it
resolves the recipe into the run every consumer reads (run/resolve.py), which `validate_recipe` returns.
It sits above `config/`, `run/` and `plan/` (it asks the planner for the memory fit), and nothing below
imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from megatron_rl.check import rules
from megatron_rl.check.files import file_problems, prompt_problems, stop_id_problems
from megatron_rl.check.ppo import critic_split_problems
from megatron_rl.check.ranges import ENUMS, NUMERIC, get_key, numeric_problems
from megatron_rl.check.rules import RULES
from megatron_rl.config.problem import ConfigError, Problem
from megatron_rl.config.schema import RecipeConfig
from megatron_rl.models.resolve import (
    CheckpointConfigError,
    disagreements,
    model_problems,
    resolve_model,
    tokenizer_problems,
)
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.rollout.convention import convention_problems
from megatron_rl.run import Run, resolve


def check_recipe(cfg: RecipeConfig, read_data: bool = True) -> list[Problem]:
    """Every problem of a recipe, of every kind (empty list = it can run).

    `read_data` also reads the problem set through the model's tokenizer (when both are readable
    here) to find prompts longer than data.max_prompt_tokens; the planner skips it."""
    return checked(cfg, read_data)[0]


def checked(cfg: RecipeConfig, read_data: bool = True) -> tuple[list[Problem], Run | None]:
    """Every problem of a recipe, and the run it resolves to (run/resolve.py) once its numbers and names
    are in range (None before: the rules between keys divide by, compare and look up those)."""
    # The model the recipe means: unset keys from its checkpoint's config.json, which set keys must
    # agree with (models/resolve.py); everything below checks that resolved model.
    try:
        model = resolve_model(cfg.model)
    except CheckpointConfigError as e:
        return [Problem("model.hf_checkpoint", cfg.model.hf_checkpoint, str(e))], None
    out = (
        disagreements(cfg.model) + model_problems(model) + tokenizer_problems(model) + stop_id_problems(model)
    )
    if out:  # no shape to check the layout, lengths or memory against
        # A shape only unreadable here (kind "unknown") still leaves every rule that needs none: those run,
        # or a recipe with a wrong batch would pass `validate` until its checkpoint appeared.
        shapeless = shape_free_problems(cfg) if all(p.kind == "unknown" for p in out) else []
        return out + shapeless + file_problems(cfg), None
    resolved_model = replace(cfg, model=model)
    out += range_problems(resolved_model)
    ro = cfg.rollout
    convention = convention_problems(ro.logprobs_mode, ro.temperature, ro.top_p, ro.top_k, training=True)
    out += convention
    if any(p.key in NUMERIC or p.key in ENUMS for p in out):
        return out, None  # the rules below divide by, compare and look up these

    run = resolve(cfg)  # the layout, the spec, the sleep level... decided once, here
    for rule in RULES:
        if not (convention and rule is rules.sampling):  # a convention already refused needs no more
            out += rule(run)
    out += file_problems(run.recipe)
    if not [p for p in out if p.kind in ("recipe", "driver")]:
        out += memory_problems(run)
    if read_data and not out and run.recipe.data.source != "synthetic":
        out += prompt_problems(run.recipe)
    return out, run


def range_problems(cfg: RecipeConfig) -> list[Problem]:
    """Names outside their sets (ENUMS) and numbers outside their ranges (NUMERIC)."""
    out = [
        Problem(key, get_key(cfg, key), f"must be one of {', '.join(map(str, allowed))}")
        for key, allowed in ENUMS.items()
        if get_key(cfg, key) not in allowed
    ]
    return out + numeric_problems(cfg)


@dataclass(frozen=True)
class _Shapeless:
    """What the shape-free rules read of a run: the recipe and its layout (no model spec)."""

    recipe: RecipeConfig
    layout: ParallelLayout


def shape_free_problems(cfg: RecipeConfig) -> list[Problem]:
    """The rules a recipe answers without its model's shape (its checkpoint unreadable here): names and
    numbers in range (the model's keys aside: unset, they are what is unknown), then the batch equation (the
    layout is the recipe's own) and, with PPO, the critic's split of the ranks and of the batch."""
    out = [p for p in range_problems(cfg) if not p.key.startswith("model.")]
    if any(p.key in NUMERIC or p.key in ENUMS for p in out):
        return out  # the batch rule divides by these
    view = _Shapeless(cfg, ParallelLayout.from_config(cfg.layout))
    out += rules.batch(view)
    if cfg.algorithm.name == "ppo":  # the critic's layout against the ranks and the batch
        out += critic_split_problems(view)
    return out


def memory_problems(run: Run) -> list[Problem]:
    """Memory fit from the planner's model (skipped for the CPU cluster, whose 'GPU' is host RAM)."""
    cfg, layout = run.recipe, run.layout
    if not run.on_gpu:
        return []
    from megatron_rl.plan.memory import memory_per_gpu

    mem = memory_per_gpu(run)
    cap = cfg.cluster.gpu_memory_gib
    trainer, engine = mem["trainer_per_gpu"], mem["engine_per_gpu"]
    # Colocated: the engine sleeps while the trainer trains, so each must fit on its own.
    worst = max(trainer, engine) if layout.colocated else trainer
    if worst > cap:
        return [
            Problem(
                "layout.tp",
                cfg.layout.tp,
                f"predicted memory {worst:.1f} GiB per GPU (trainer {trainer:.1f}, engine {engine:.1f}) exceeds "
                f"cluster.gpu_memory_gib={cap}; raise tp/pp, use layout.recompute=full, or more GPUs "
                "(`megatron-rl plan` shows the breakdown)",
                "memory",
            )
        ]
    # Colocated: vLLM claims gpu_memory_utilization x the GPU at construction, beside the trainer's params.
    util = cfg.rollout.gpu_memory_utilization
    kept = mem["trainer"]["resident_at_engine_construction"]
    if layout.colocated and kept + util * cap > cap:
        return [
            Problem(
                "rollout.gpu_memory_utilization",
                util,
                f"building the engine claims {util} x {cap} GiB while the trainer keeps {kept:.1f} GiB of "
                f"params per GPU: {kept + util * cap:.1f} GiB > {cap} GiB; lower it to at most "
                f"{(cap - kept) / cap:.2f} or raise layout.tp/pp",
                "memory",
            )
        ]
    return []


# Which kinds each command refuses (the rest it may print as notes).
REFUSES = {
    # The driver, before building anything; "launch": what only the job's launch provides (the endpoints
    # of the reward fleet slurm/train.sbatch starts), so neither validate nor submit notes it.
    "run": ("recipe", "driver", "memory", "files", "unknown", "launch"),
    # Wherever validate or submit runs; `blocking` adds the paths where they must be readable from here.
    "validate": ("recipe", "driver", "memory"),
    # The planner models future layouts and shows memory that does not fit, but needs the model's shape.
    "plan": ("recipe", "unknown"),
}


def refused(problems: list[Problem], purpose: str) -> list[Problem]:
    return [p for p in problems if p.kind in REFUSES[purpose]]


def runs_here(recipe: RecipeConfig) -> bool:
    """A recipe for this machine: a CPU cluster, which `megatron-rl run` launches where the command runs."""
    return recipe.cluster.gpu == "cpu"


def blocking(
    problems: list[Problem], recipe: RecipeConfig, command: str, remote_paths: bool = False
) -> list[Problem]:
    """What `validate` or `submit` (`command`) refuses: what the recipe check refuses wherever it runs,
    and the paths this machine cannot see ("files"; "unknown": a checkpoint whose shape is unreadable)
    where they must be seen from here:
    - `validate` of a recipe that runs here (`runs_here`) refuses them, but for the CPU fixture
      checkpoint that `megatron-rl run` builds before it starts (`model.fixture`);
    - `submit` refuses them unless told they are remote (`remote_paths`, `--remote-paths`): a login node
      sees the file system its jobs see, and a job that cannot read its paths fails when it starts.
    Anywhere else (`validate` of a GPU cluster's recipe, on a laptop) they are notes."""
    out = refused(problems, "validate")
    unseen = [p for p in problems if p.kind in ("files", "unknown")]
    if command == "submit" and not remote_paths:
        out += unseen
    elif command == "validate" and runs_here(recipe):
        out += [p for p in unseen if not (p.kind == "unknown" and recipe.model.fixture)]
    return out


def notes(problems: list[Problem], purpose: str, blocked: list[Problem] = ()) -> list[str]:
    """One line per problem this command lets through (neither refused by `purpose` nor in `blocked`), so
    nothing is silently skipped."""
    out = []
    for p in problems:
        if p.kind not in REFUSES[purpose] and p not in blocked and p.kind != "launch":
            if p.kind in ("files", "unknown"):
                out.append(f"not checked here: {p}; the driver checks it before building anything")
            else:
                out.append(f"note: {p}")
    return out


def validate_recipe(cfg: RecipeConfig, purpose: str = "run", read_data: bool = True) -> Run:
    """Raise ConfigError listing every problem `purpose` refuses; return the resolved run when none: what
    every consumer reads (run/resolve.py), so none of them decides the layout, the model or the
    sampling again. `read_data=False` skips reading the problem set (a rank whose launcher did, with
    the same files: check/seal.py)."""
    problems, run = checked(cfg, read_data)
    problems = refused(problems, purpose)
    if problems:
        raise ConfigError(problems, getattr(cfg, "name", ""))
    return run
