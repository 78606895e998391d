"""The recipe a run was launched with, read back from its run directory (`recipe.json`, written by the
run at start-up with every override applied), so `megatron-rl plan --from-steps RUN/steps.jsonl` needs
no recipe name and plans exactly the configuration that produced the measurements."""

from __future__ import annotations

import json
from pathlib import Path

from megatron_rl.plan.inputs import PlanError


def recipe_of_run(steps_path: str | Path):
    """RecipeConfig from the recipe.json next to a steps.jsonl; PlanError saying what to pass instead."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from megatron_rl.config.schema import RecipeConfig

    path = Path(steps_path).parent / "recipe.json"
    if not path.is_file():
        raise PlanError(
            f"no recipe given and no {path} next to the step records; name the recipe the run used: "
            f"megatron-rl plan RECIPE [overrides] --from-steps {steps_path}"
        )
    try:
        saved = json.loads(path.read_text())
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RecipeConfig), saved))
    except (json.JSONDecodeError, OmegaConfBaseException) as e:
        raise PlanError(f"{path} does not read back as a recipe ({e}); name the recipe instead") from None
