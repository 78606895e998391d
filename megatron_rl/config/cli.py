"""`megatron-rl show | validate | cp | list`: recipes without a GPU."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from megatron_rl.check import check_recipe, notes, refused
from megatron_rl.config.load import (
    RecipeError,
    RecipeNotFound,
    load_recipe,
    resolve_recipe,
    shipped_recipes,
    to_yaml,
)


def _parse(prog: str, argv: list[str], doc: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"megatron-rl {prog}", description=doc)
    p.add_argument("recipe", help="a shipped recipe name or a path to a recipe YAML")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. layout.tp=4 rollout.temperature=0.8")
    return p.parse_args(argv)


def _load(args) -> object:
    try:
        return load_recipe(args.recipe, args.overrides)
    except (RecipeNotFound, RecipeError) as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:  # a recipe path that is a folder, unreadable, ...
        print(f"error: cannot read recipe {args.recipe!r}: {e}", file=sys.stderr)
    return None


def show(argv: list[str]) -> int:
    args = _parse("show", argv, "Print a recipe fully resolved (after overrides).")
    recipe = _load(args)
    if recipe is None:
        return 2
    print(f"# {resolve_recipe(args.recipe)}" + (f" + {' '.join(args.overrides)}" if args.overrides else ""))
    print(to_yaml(recipe), end="")
    return 0


def validate(argv: list[str]) -> int:
    args = _parse(
        "validate", argv, "Check a recipe without a GPU: shapes vs layout, world size, batch, memory."
    )
    recipe = _load(args)
    if recipe is None:
        return 2
    # The driver's own check (megatron_rl/check.py); paths on the cluster's storage may be unreadable
    # from here, so those are noted, and the driver refuses them before building anything.
    problems = check_recipe(recipe)
    if refused(problems, "validate"):
        listed = "\n".join(f"  - {p}" for p in refused(problems, "validate"))
        print(f"error: recipe {recipe.name!r} is invalid:\n{listed}", file=sys.stderr)
        return 1
    for line in notes(problems, "validate"):
        print(line, file=sys.stderr)
    from megatron_rl.checkpoint.store import fresh_start_conflict
    from megatron_rl.loop.names import run_name

    conflict = fresh_start_conflict(recipe.checkpoint.resume, Path(recipe.checkpoint.dir) / run_name(recipe))
    if conflict:
        print(f"error: {conflict}", file=sys.stderr)
        return 1
    lay = recipe.layout
    print(
        f"ok: {recipe.name}: trainer tp{lay.tp} x pp{lay.pp} x dp{lay.dp}, {lay.engine_count} engines of tp"
        f"{lay.engine_tp} ({lay.placement}) on {recipe.cluster.nodes} x {recipe.cluster.gpus_per_node} "
        f"{recipe.cluster.gpu}"
    )
    return 0


def cp(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="megatron-rl cp",
        description="Copy a shipped recipe into DIR for editing. The copy is what runs when you pass its path "
        "(megatron-rl train DIR/NAME.yaml), even if it keeps the shipped name.",
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
    try:
        shutil.copyfile(src, dest)
    except OSError as e:
        print(f"error: cannot write {dest}: {e}", file=sys.stderr)
        return 1
    print(f"copied {src} -> {dest}\nedit it, then: megatron-rl validate {dest}")
    return 0


def list_recipes(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="megatron-rl list", description="List the shipped recipes.").parse_args(argv)
    for name, path in shipped_recipes().items():
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        print(f"{name:32s} {first.removeprefix('# ')}")
    return 0
