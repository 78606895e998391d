"""Paths a recipe names: relative ones in a recipe file are read from its folder (config/paths.py), and
`validate` and `submit` refuse a path the job could not read where they run where the job will."""

from __future__ import annotations

import json
import os

import pytest

from megatron_rl.cli import main
from megatron_rl.config.load import load_recipe

RECIPE = """\
# Launch: megatron-rl run mine/own.yaml
defaults:
  - /base
  - override /model: qwen2_fixture
  - override /data: mine
  - _self_

name: own
model:
  hf_checkpoint: ../ckpt
rollout:
  max_new_tokens: 64
  mean_completion_tokens: 48
checkpoint:
  dir: ckpts
  resume: none
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A recipe of one's own in `proj/mine/`, its data group beside it, the command run from elsewhere."""
    mine = tmp_path / "proj" / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "own.yaml").write_text(RECIPE)
    (mine / "data" / "mine.yaml").write_text(
        "source: problems.jsonl\nprompt_tokens: 96\nmax_prompt_tokens: 320\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return mine


def test_relative_paths_in_a_recipe_file_are_read_from_its_folder(project):
    recipe = load_recipe(str(project / "own.yaml"))
    assert recipe.model.hf_checkpoint == str(project.parent / "ckpt")  # `..` normalised
    assert recipe.data.source == str(project / "problems.jsonl")  # set by the group file beside it
    assert recipe.checkpoint.dir == str(project / "ckpts")
    # Names that are not paths, and the shipped groups' defaults, are kept (the working directory's).
    assert recipe.checkpoint.resume == "none" and recipe.logger.run_dir == "outputs"
    # A path on the command line is a shell's: read from the directory the command runs in, as typed.
    typed = load_recipe(str(project / "own.yaml"), ["data.source=here.jsonl", "checkpoint.dir=c"])
    assert typed.data.source == "here.jsonl" and typed.checkpoint.dir == "c"
    assert typed.model.hf_checkpoint == str(project.parent / "ckpt")
    assert load_recipe(str(project / "own.yaml"), ["data=bundled"]).data.source == "bundled"
    # A shipped recipe's own defaults are untouched.
    assert load_recipe("grpo_tiny_cpu").checkpoint.dir == "checkpoints"


def _problems_file(path) -> None:
    row = {"id": "a", "prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]}
    path.write_text(json.dumps(row) + "\n")


def test_validate_of_a_recipe_for_this_machine_refuses_a_path_it_cannot_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = main(["validate", "grpo_tiny_hf_cpu", "data.source=mistyped.jsonl"])
    err = capsys.readouterr().err
    assert rc == 1 and "data.source='mistyped.jsonl': does not exist" in err
    assert "runs on this machine" in err and "ok:" not in err
    _problems_file(tmp_path / "mistyped.jsonl")
    assert main(["validate", "grpo_tiny_hf_cpu", "data.source=mistyped.jsonl"]) == 0
    capsys.readouterr()
    # The CPU fixture checkpoint is not refused: `megatron-rl run` builds it before it starts.
    assert main(["validate", "grpo_tiny_hf_cpu", f"model.hf_checkpoint={tmp_path / 'unbuilt'}"]) == 0
    assert "launch_local builds it" in capsys.readouterr().err
    rc = main(
        ["validate", "grpo_tiny_hf_cpu", f"model.hf_checkpoint={tmp_path / 'unbuilt'}", "model.fixture=''"]
    )
    assert rc == 1 and "model.hf_checkpoint=" in capsys.readouterr().err
    rc = main(
        ["validate", "grpo_tiny_hf_cpu", "data.source=mistyped.jsonl", "checkpoint.resume=gone", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and [p["key"] for p in out["problems"]] == ["checkpoint.resume"]


def test_validate_of_a_gpu_clusters_recipe_notes_its_paths(capsys):
    """A laptop cannot see the cluster's storage: a note, and what `submit` will do about it."""
    assert main(["validate", "grpo_qwen2.5-7b_1n8g"]) == 0
    err = capsys.readouterr().err
    assert "not checked here: model.hf_checkpoint='/shared/models/Qwen2.5-7B-Instruct'" in err
    assert "submit` refuses them unless --remote-paths" in err


def test_validate_finds_the_data_beside_the_recipe_from_any_directory(project, capsys, monkeypatch):
    """The checkpoint and problems the recipe names relative to itself are read (not noted as missing),
    whichever directory validate runs from."""
    from megatron_rl.models.fixture import build_fixture

    _problems_file(project / "problems.jsonl")
    build_fixture("qwen2", project.parent / "ckpt")
    for cwd, recipe in ((os.getcwd(), str(project / "own.yaml")), (project, "own.yaml")):
        monkeypatch.chdir(cwd)
        rc = main(["validate", recipe, "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["notes"] == [], out
        assert {600, 602} <= set(out["stop_token_ids"] or ()), out  # the checkpoint was read
