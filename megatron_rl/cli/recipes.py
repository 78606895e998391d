"""`megatron-rl show | validate | cp | list`: recipes without a GPU."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from megatron_rl.check.recipe import blocking, checked, notes, runs_here
from megatron_rl.config.load import (
    RecipeError,
    RecipeNotFound,
    load_recipe,
    resolve_recipe,
    shipped_recipes,
    to_yaml,
)
from megatron_rl.config.problem import Problem
from megatron_rl.rollout.agreement import guard


def _parser(prog: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"megatron-rl {prog}", description=doc)
    p.add_argument("recipe", help="a shipped recipe name or a path to a recipe YAML")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. layout.tp=4 rollout.temperature=0.8")
    return p


def _parse(prog: str, argv: list[str], doc: str) -> argparse.Namespace:
    return _parser(prog, doc).parse_args(argv)


def _try_load(args) -> tuple[object | None, str]:
    """(the recipe, "") or (None, why it cannot be loaded)."""
    try:
        return load_recipe(args.recipe, args.overrides), ""
    except (RecipeNotFound, RecipeError) as e:
        return None, str(e)
    except OSError as e:  # a recipe path that is a folder, unreadable, ...
        return None, f"cannot read recipe {args.recipe!r}: {e}"


def _load(args) -> object:
    recipe, error = _try_load(args)
    if recipe is None:
        print(f"error: {error}", file=sys.stderr)
    return recipe


def show(argv: list[str]) -> int:
    args = _parse("show", argv, "Print a recipe fully resolved (after overrides).")
    recipe = _load(args)
    if recipe is None:
        return 2
    print(f"# {resolve_recipe(args.recipe)}" + (f" + {' '.join(args.overrides)}" if args.overrides else ""))
    from dataclasses import replace

    from megatron_rl.models.resolve import CheckpointConfigError, resolve_model

    try:  # the model the recipe means: unset keys from its checkpoint's config.json
        resolved = resolve_model(recipe.model)
    except CheckpointConfigError as e:
        print(f"# {e}")
        resolved = recipe.model
    if resolved.num_layers is not None and recipe.model.num_layers is None:
        print(f"# model keys left unset are read from {recipe.model.hf_checkpoint}/config.json")
    elif recipe.model.num_layers is None and recipe.model.hf_checkpoint:
        print(
            f"# {recipe.model.hf_checkpoint}/config.json is not readable here: the model's shape is unknown"
        )
    print(to_yaml(replace(recipe, model=resolved)), end="")
    return 0


def _conflict(recipe) -> Problem | None:
    """A fresh start (checkpoint.resume=none) over a run's existing checkpoints, which it would mix with."""
    from megatron_rl.checkpoint.store import fresh_start_conflict
    from megatron_rl.loop.record.names import run_name

    c = recipe.checkpoint
    message = fresh_start_conflict(c.resume, Path(c.dir) / run_name(recipe))
    return Problem("checkpoint.resume", c.resume, message, "files") if message else None


def resolved_stop_ids(recipe, run=None) -> list[int] | None:
    """The ids the engines will stop at (the recipe's and the checkpoint's end ids): the run's when the
    recipe resolves, else read as it would; None when `model.hf_checkpoint` is unset or unreadable here
    (the driver reads it where the run runs)."""
    if not recipe.model.hf_checkpoint:
        return None
    if run is not None:
        return None if run.checkpoint_stop_ids is None else list(run.sampling.stop_token_ids)
    from megatron_rl.rollout.types import merged_stop_ids
    from megatron_rl.run.resolve import checkpoint_stop_ids

    ids = checkpoint_stop_ids(recipe.model.hf_checkpoint)
    return None if ids is None else list(merged_stop_ids(recipe.rollout.stop_token_ids, ids))


def _validate_json(args) -> int:
    """The verdict as one JSON object on stdout, for scripts: the text form's facts, structured."""
    recipe, error = _try_load(args)
    if recipe is None:
        problem = Problem("recipe", args.recipe, error)
        out = {
            "ok": False,
            "recipe": None,
            "problems": [asdict(problem)],
            "notes": [],
            "stop_token_ids": None,
            "agreement": None,
        }
        print(json.dumps(out, default=str))
        return 2
    problems, run = checked(recipe)
    blocked = blocking(problems, recipe, "validate")
    conflict = None if blocked else _conflict(recipe)  # the text form stops at the first refusal too
    if conflict:
        blocked.append(conflict)
    out = {
        "ok": not blocked,
        "recipe": recipe.name,
        "problems": [asdict(p) for p in blocked],
        "notes": notes(problems, "validate", blocked),
        "stop_token_ids": resolved_stop_ids(recipe, run),
        "agreement": None if blocked or run is None else guard(run),  # thresholds, the probe, what acts
    }
    print(json.dumps(out, default=str))
    return 0 if out["ok"] else 1


def validate(argv: list[str]) -> int:
    p = _parser("validate", "Check a recipe without a GPU: shapes vs layout, world size, batch, memory.")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: ok, problems [{key, value, message, kind}], notes, and the engines' "
        "stop_token_ids (null unless model.hf_checkpoint is readable here)",
    )
    args = p.parse_args(argv)
    if args.json:
        return _validate_json(args)
    recipe = _load(args)
    if recipe is None:
        return 2
    # The driver's own check (megatron_rl/check/recipe.py). A path this machine cannot read is refused when
    # the recipe runs here; a GPU cluster's storage may hold it, so there it is noted, and the driver (and
    # `submit`, unless told the paths are remote) refuses it before building anything.
    problems, run = checked(recipe)
    blocked = blocking(problems, recipe, "validate")
    if blocked:
        listed = "\n".join(f"  - {p}" for p in blocked)
        print(f"error: recipe {recipe.name!r} is invalid:\n{listed}", file=sys.stderr)
        if any(p.kind in ("files", "unknown") for p in blocked):
            print(
                f"({recipe.name} runs on this machine (cluster.gpu=cpu), so its paths must be readable here; "
                "a relative path in a recipe file is read from the file's folder, on the command line from "
                "the current directory)",
                file=sys.stderr,
            )
        return 1
    for line in notes(problems, "validate"):
        print(line, file=sys.stderr)
    if any(p.kind in ("files", "unknown") for p in problems) and not runs_here(recipe):
        print(
            "(the cluster's storage may hold them; `megatron-rl submit` refuses them unless --remote-paths)",
            file=sys.stderr,
        )
    conflict = _conflict(recipe)
    if conflict:
        print(f"error: {conflict.message}", file=sys.stderr)
        return 1
    lay = recipe.layout
    print(
        f"ok: {recipe.name}: trainer tp{lay.tp} x pp{lay.pp} x dp{lay.dp}, {lay.engine_count} engines of tp"
        f"{lay.engine_tp} ({lay.placement}) on {recipe.cluster.nodes} x {recipe.cluster.gpus_per_node} "
        f"{recipe.cluster.gpu}"
    )
    if run is None:  # the model's shape is not readable here: the driver resolves it where it runs
        print("agreement: not resolved here (the model's checkpoint is not readable on this machine)")
        return 0
    agreement = guard(run)
    for why in agreement["unguarded"]:
        print(f"warning: the publication is unguarded: {why}", file=sys.stderr)
    t = agreement["thresholds"]
    print(
        f"agreement: {t['trainer_dtype']} trainer, {t['engine_dtype']} engine: max gap {t['max_gap']:.3g}, mean "
        f"gap {t['mean_gap']:.3g} nats ({t['source']}{'' if t['step_max'] else '; a step: its mean only'}); on "
        f"disagreement: {agreement['action']}"
    )
    return 0


def cp(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="megatron-rl cp",
        description="Copy a shipped recipe into DIR for editing. The copy is what runs when you pass its path "
        "(megatron-rl run DIR/NAME.yaml), even if it keeps the shipped name; its launch comment is rewritten "
        "to name the copy.",
    )
    p.add_argument("recipe")
    p.add_argument("dir")
    p.add_argument("--force", action="store_true", help="overwrite an existing copy")
    args = p.parse_args(argv)
    try:
        src = resolve_recipe(args.recipe)
    except RecipeNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dest_dir = Path(args.dir)
    if dest_dir.exists() and not dest_dir.is_dir():
        print(
            f"error: {dest_dir} is a file; cp takes a folder (the copy is named {src.name} inside it)",
            file=sys.stderr,
        )
        return 1
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"error: cannot create folder {dest_dir}: {e}", file=sys.stderr)
        return 1
    dest = dest_dir / src.name
    if dest.exists() and not args.force:
        print(f"error: {dest} exists; pass --force to overwrite it", file=sys.stderr)
        return 1
    typed = shlex.quote(str(dest))  # the copy as a shell names it from here
    try:
        dest.write_text(relaunched(src.read_text(), src, typed))
    except OSError as e:
        print(f"error: cannot write {dest}: {e}", file=sys.stderr)
        return 1
    print(f"copied {src} -> {dest}\nedit it, then: megatron-rl validate {typed}")
    return 0


def relaunched(text: str, src: Path, copy: str) -> str:
    """The recipe `text` with its leading launch comment (`# Launch: CMD`, then `#   (= CMD` lines of
    equivalent commands) naming `copy` instead of `src`: a copy that said `# Launch: make demo-hf` would
    tell its reader to run the shipped recipe, not the edited one. Commands that do not name the recipe
    (a make target) are dropped; a file without a launch comment is returned unchanged."""
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].startswith("# Launch:"):
        return text
    n = 1
    while n < len(lines) and re.match(r"#\s+\(?=\s", lines[n]):
        n += 1
    commands = [lines[0].removeprefix("# Launch:").strip()]
    commands += [re.sub(r"^#\s+\(?=\s*", "", line).rstrip() for line in lines[1:n]]
    if n > 1 and commands[-1].endswith(")"):  # the parenthesis the equivalents close
        commands[-1] = commands[-1][:-1]

    def names_recipe(token: str) -> bool:
        return token == src.stem or Path(token).name == src.name

    mine = [
        " ".join(copy if names_recipe(t) else t for t in c.split())
        for c in commands
        if any(names_recipe(t) for t in c.split())
    ] or [f"megatron-rl run {copy}"]
    head = [f"# Launch: {mine[0]}\n"]
    if len(mine) > 1:
        head += [f"#   (= {mine[1]}\n"] + [f"#    = {c}\n" for c in mine[2:]]
        head[-1] = head[-1][:-1] + ")\n"
    return "".join(head + lines[n:])


def list_recipes(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="megatron-rl list", description="List the shipped recipes.").parse_args(argv)
    for name, path in shipped_recipes().items():
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        print(f"{name:32s} {first.removeprefix('# ')}")
    return 0
