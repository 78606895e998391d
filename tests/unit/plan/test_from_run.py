"""`plan --from-steps RUN/steps.jsonl` without a recipe name plans the run's own recipe (recipe.json)."""

from __future__ import annotations

import json
from dataclasses import asdict

from megatron_rl.cli.plan import main
from megatron_rl.config.load import load_recipe

OVERRIDES = ["data.prompts_per_step=4", "rollout.samples_per_prompt=16"]
STEP = {
    "step": 1,
    "phases": {
        "generation": {"seconds": 2.0, "mem_gib": 1.0},
        "train_fwd_bwd": {"seconds": 1.0, "mem_gib": 1.0},
    },
}


def _run_dir(tmp_path):
    recipe = load_recipe("grpo_tiny_cpu", OVERRIDES)
    # As loop/record/records.py writes it.
    (tmp_path / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1, default=str))
    (tmp_path / "steps.jsonl").write_text(json.dumps(STEP) + "\n")
    return tmp_path / "steps.jsonl"


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_runs_own_recipe_is_planned(tmp_path, capsys):
    steps = str(_run_dir(tmp_path))
    rc, own, err = _plan(capsys, "--no-search", "--json", "--from-steps", steps)
    assert rc == 0, err
    _, named, _ = _plan(capsys, "grpo_tiny_cpu", *OVERRIDES, "--no-search", "--json", "--from-steps", steps)
    _, default, _ = _plan(capsys, "grpo_tiny_cpu", "--no-search", "--json", "--from-steps", steps)
    assert json.loads(own) == json.loads(named), "the run's recipe.json is the recipe with its overrides"
    assert json.loads(own) != json.loads(default)


def test_measured_next_to_predicted(tmp_path, capsys):
    rc, out, _ = _plan(capsys, "--no-search", "--from-steps", str(_run_dir(tmp_path)))
    assert rc == 0
    table = out[out.index("Calibration from 1 measured step ") :].splitlines()
    assert table[1].split() == ["phase", "measured", "predicted", "calibration"]
    assert table[2].split()[:2] == ["generation", "2.00"]


def test_without_recipe_or_recipe_json_the_error_says_what_to_pass(tmp_path, capsys):
    rc, _, err = _plan(capsys, "--no-search")
    assert rc == 2 and "--from-steps" in err
    (tmp_path / "steps.jsonl").write_text(json.dumps(STEP) + "\n")
    rc, _, err = _plan(capsys, "--from-steps", str(tmp_path / "steps.jsonl"))
    assert rc == 2 and "recipe.json" in err and "megatron-rl plan RECIPE" in err and "Traceback" not in err
    rc, _, err = _plan(capsys, "steps=3", "--from-steps", str(tmp_path / "steps.jsonl"))
    assert rc == 2 and "overrides need a recipe name" in err
