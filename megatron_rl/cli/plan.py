"""`megatron-rl plan RECIPE [overrides...] [--json] [--plot FILE] [--from-steps F]`.

With `--from-steps RUN/steps.jsonl` the recipe may be left out: the run's own recipe.json is planned.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from megatron_rl.plan.calibrate import calibrate, read_steps, summarize
from megatron_rl.plan.cycle import cycle
from megatron_rl.plan.inputs import PlanError, inputs_from_run
from megatron_rl.plan.render import render
from megatron_rl.plan.report import build_report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-rl plan",
        description="Size a run before renting GPUs: time, GPU-seconds, memory, publication, failures, layouts.",
    )
    p.add_argument(
        "recipe",
        nargs="?",
        help="a shipped recipe name or a path to a recipe YAML (default with --from-steps: the run's own)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides, e.g. cluster.nodes=16 layout.dp=8 layout.engine_count=32",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of text")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="write a PNG Gantt of two steps: the recipe's layout and the one the search ranks first",
    )
    p.add_argument(
        "--from-steps", metavar="F", help="steps.jsonl of a run: replace assumed phase times with measured"
    )
    p.add_argument(
        "--recovery",
        metavar="F",
        help="benchmarks/recovery.py's JSON: plan failures with its measured detection, requeue and start-up",
    )
    p.add_argument("--no-search", action="store_true", help="skip the layout search")
    p.add_argument("--top", type=int, default=10, help="layouts to list from the search (default 10)")
    return p


def _clean(x):
    """JSON without NaN/inf: non-finite numbers become null."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _recovery(path: str) -> tuple[float, str]:
    from megatron_rl.plan.reliability import restart_from_recovery

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PlanError(
            f"--recovery {path}: not readable JSON ({e}); write it with benchmarks/recovery.py"
        ) from e
    try:
        return restart_from_recovery(data, path)
    except ValueError as e:
        raise PlanError(f"--recovery {e}") from e


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    from megatron_rl.check.recipe import checked, refused
    from megatron_rl.config.load import RecipeError, RecipeNotFound, load_recipe

    if args.recipe is not None and "=" in args.recipe:  # an override, not a recipe name
        args.overrides, args.recipe = [args.recipe, *args.overrides], None
    try:
        if args.plot and Path(args.plot).is_dir():
            raise PlanError(f"--plot {args.plot} is a folder; name the PNG file to write")
        if args.recipe is None:
            if not args.from_steps:
                raise PlanError("name a recipe (megatron-rl list), or pass --from-steps RUN/steps.jsonl")
            if args.overrides:
                raise PlanError("overrides need a recipe name: megatron-rl plan RECIPE [overrides] ...")
            from megatron_rl.plan.from_run import recipe_of_run

            recipe = recipe_of_run(args.from_steps)
        else:
            recipe = load_recipe(args.recipe, args.overrides)
        # The driver's own check; the planner still sizes layouts the driver cannot run yet (top-p/top-k
        # truncated sampling, context parallelism) and memory that does not fit (the report shows where).
        found, run = checked(recipe, read_data=False)
        problems = refused(found, "plan")
        if problems or run is None:
            listed = "\n".join(f"  - {p}" for p in problems or found)
            raise PlanError(f"recipe {recipe.name!r} is invalid (megatron-rl validate):\n{listed}")
        inp, layout = inputs_from_run(run), run.layout
        cal = None
        if args.from_steps:
            cal = calibrate(inp, layout, cycle(inp, layout), summarize(read_steps(args.from_steps)))
        recovery = _recovery(args.recovery) if args.recovery else None
        report = build_report(
            inp, layout, calibration=cal, with_search=not args.no_search, top=args.top, recovery=recovery
        )
    except (PlanError, RecipeNotFound, RecipeError) as e:
        print(f"megatron-rl plan: {e}", file=sys.stderr)
        return 2
    if args.plot:
        from megatron_rl.plan.plot import gantt

        written = gantt(report, args.plot)
    if args.json:
        print(json.dumps(_clean(report.to_json()), indent=2))
    else:
        print(render(report), end="")
        if args.plot:
            print(f"Gantt written to {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
