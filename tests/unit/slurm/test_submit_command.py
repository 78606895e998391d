"""`megatron-rl submit`: the sbatch command follows the recipe, and a layout that does not fit is refused."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from megatron_rl.config.load import REPO_ROOT, load_recipe, shipped_recipes
from megatron_rl.layout import ParallelLayout
from megatron_rl.slurm_submit import fit_problems, main, request_from_recipe, sbatch_command


def flags(cmd: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_command_matches_the_recipes_cluster_and_layout(name):
    recipe = load_recipe(name)
    assert fit_problems(recipe) == []
    cmd = sbatch_command(request_from_recipe(recipe), name, ["steps=3"], cwd=REPO_ROOT)
    f, c = flags(cmd), recipe.cluster
    assert cmd[0] == "sbatch" and cmd[-3:] == ["slurm/train.sbatch", name, "steps=3"]
    assert (int(f["nodes"]), int(f["gpus-per-node"]), int(f["ntasks-per-node"])) == (
        c.nodes,
        c.gpus_per_node,
        c.gpus_per_node,
    )
    assert int(f["nodes"]) * int(f["ntasks-per-node"]) == ParallelLayout.from_config(recipe.layout).world_size
    assert f["time"] == c.time_limit and f["job-name"] == recipe.name
    assert f["output"] == "logs/%x-%j.log"
    assert "partition" not in f and "account" not in f and "export" not in f  # none set in shipped recipes


def test_partition_account_image_and_outside_checkout():
    recipe = load_recipe(
        "grpo_qwen2.5-7b_1n8g",
        [
            "cluster.partition=gpu",
            "cluster.account=proj7",
            "cluster.container_image='nvcr.io#nvidia/pytorch:25.01-py3'",
        ],
    )
    cmd = sbatch_command(request_from_recipe(recipe), "grpo_qwen2.5-7b_1n8g", [], cwd=Path("/"))
    f = flags(cmd)
    assert f["partition"] == "gpu" and f["account"] == "proj7"
    # From outside the checkout the script is absolute and the batch job is told where the checkout is.
    assert f["export"] == f"ALL,CONTAINER_IMAGE=nvcr.io#nvidia/pytorch:25.01-py3,MEGATRON_RL_HOME={REPO_ROOT}"
    assert cmd[-2] == str(REPO_ROOT / "slurm" / "train.sbatch")


def test_layout_that_does_not_fit_the_nodes_is_refused_with_why(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "")  # had it tried to submit, sbatch would be missing
    rc = main(["grpo_qwen2.5-7b_1n8g", "cluster.nodes=2"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert "refused" in err and "does not fit the requested nodes" in err
    assert "the layout starts 8 ranks" in err and "cluster.nodes=2 x cluster.gpus_per_node=8 = 16 GPUs" in err
    assert "set cluster.nodes=1" in err


def test_fit_problems_name_each_cause():
    recipe = load_recipe("grpo_qwen2.5-7b_1n8g")
    recipe.cluster.gpus_per_node, recipe.cluster.nodes = 4, 2  # 8 GPUs still, but TP4 engines TP2 ok
    assert fit_problems(recipe) == []
    recipe.layout.tp, recipe.layout.dp, recipe.cluster.nodes = 8, 1, 2  # TP8 across two nodes of 4
    [tp] = fit_problems(recipe)
    assert tp.startswith("layout.tp=8 does not fit inside one node of 4 GPUs")
    recipe.layout.tp, recipe.layout.dp = 4, 2
    recipe.cluster.time_limit = "2 days"
    [t] = fit_problems(recipe)
    assert "cluster.time_limit='2 days' is not a Slurm time" in t
    recipe.cluster.time_limit = "2-00:00:00"
    recipe.layout.engine_count = 8  # 8 engines of TP2 on 8 colocated ranks
    [e] = fit_problems(recipe)
    assert "16 engine ranks exceed the 8 ranks" in e


def test_separated_placement_counts_engine_gpus():
    recipe = load_recipe("grpo_tiny_cpu", ["layout.placement=separated"])
    # trainer TP2 + 2 engines of TP1 = 4 ranks on 1 x 2 GPUs
    [p] = fit_problems(recipe)
    assert "the layout starts 4 ranks" in p and "set cluster.nodes=2" in p
    recipe.cluster.gpus_per_node = 4
    assert fit_problems(recipe) == []


def test_dry_run_prints_and_does_not_submit(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")  # no sbatch: a submission attempt would fail with exit 2
    monkeypatch.chdir(tmp_path)
    assert main(["grpo_tiny_cpu", "steps=2", "--dry-run", "--sbatch=--qos=debug"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    cmd = shlex.split(out[0])
    assert cmd[-3:] == [str(REPO_ROOT / "slurm" / "train.sbatch"), "grpo_tiny_cpu", "steps=2"]
    assert "--qos=debug" in cmd and "--nodes=1" in cmd and "--ntasks-per-node=2" in cmd
    assert not (tmp_path / "logs").exists(), "a dry run writes nothing"
    assert main(["grpo_tiny_cpu"]) == 2  # without --dry-run it does try sbatch
    assert "sbatch is not on PATH" in capsys.readouterr().err


def test_unknown_recipe_and_bad_override_are_errors(capsys):
    assert main(["no_such_recipe", "--dry-run"]) == 2
    assert "no recipe named 'no_such_recipe'" in capsys.readouterr().err
    assert main(["grpo_tiny_cpu", "cluster.gpus=3", "--dry-run"]) == 2
    assert "does not compose" in capsys.readouterr().err
