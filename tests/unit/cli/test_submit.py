"""`megatron-rl submit`: the sbatch command follows the recipe, and a layout that does not fit is refused."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from megatron_rl.check.recipe import check_recipe
from megatron_rl.cli.submit import main, request_from_recipe, sbatch_command
from megatron_rl.config.load import REPO_ROOT, load_recipe, shipped_recipes
from megatron_rl.parallel.layout import ParallelLayout


def flags(cmd: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_command_matches_the_recipes_cluster_and_layout(name):
    recipe = load_recipe(name)
    assert [p for p in check_recipe(recipe) if p.kind != "files"] == []
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
    assert "refused" in err and "was not submitted" in err
    assert "trainer world tp x pp x dp x cp = 8 must equal cluster.nodes x cluster.gpus_per_node = 16" in err
    assert "set cluster.nodes=1" in err and "set layout.dp=4" in err


def _layout_problems(recipe) -> list[str]:
    return [str(p) for p in check_recipe(recipe) if p.kind not in ("files", "memory")]


def test_layout_problems_name_each_cause():
    recipe = load_recipe("grpo_qwen2.5-7b_1n8g")
    recipe.cluster.gpus_per_node, recipe.cluster.nodes = 4, 2  # 8 GPUs still, but TP4 engines TP2 ok
    assert _layout_problems(recipe) == []
    recipe.layout.tp, recipe.layout.dp, recipe.cluster.nodes = 8, 1, 2  # TP8 across two nodes of 4
    kv, node = _layout_problems(recipe)  # 4 KV groups cannot shard over TP8 either
    assert "layout.tp must divide model.num_query_groups=4" in kv
    assert node.startswith("layout.tp=8: does not fit inside one node of 4 GPUs")
    recipe.layout.tp, recipe.layout.dp = 4, 2
    recipe.cluster.time_limit = "2 days"
    [t] = _layout_problems(recipe)
    assert "cluster.time_limit='2 days': is not a Slurm time" in t
    recipe.cluster.time_limit = "2-00:00:00"
    recipe.layout.engine_count = 8  # 8 engines of TP2 on 8 colocated ranks
    [e] = _layout_problems(recipe)
    assert "16 engine ranks exceed the 8 trainer ranks" in e


def test_a_path_the_job_could_not_read_refuses_the_submission_unless_told_it_is_remote(
    capsys, monkeypatch, tmp_path
):
    """From a login node, which sees what its jobs see, a mistyped path would queue a job that cannot
    start: refused, naming the path and the flag; `--remote-paths` notes it instead."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "")  # had it tried to submit, sbatch would be missing
    rc = main(["grpo_tiny_cpu", f"checkpoint.resume={tmp_path / 'no_such_step'}", "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and "was not submitted" in err
    assert f"checkpoint.resume='{tmp_path / 'no_such_step'}'" in err
    assert "this machine cannot see checkpoint.resume" in err and "--remote-paths" in err
    assert "(megatron-rl validate)" in err  # a CPU recipe: validate refuses the path too
    rc = main(
        ["grpo_tiny_cpu", f"checkpoint.resume={tmp_path / 'no_such_step'}", "--dry-run", "--remote-paths"]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out.startswith("sbatch ") and "not checked here: checkpoint.resume=" in err
    # A GPU cluster's recipe: its checkpoint on the cluster's storage is not here either.
    assert main(["grpo_qwen2.5-7b_1n8g", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "this machine cannot see model.hf_checkpoint" in err
    assert "(megatron-rl validate)" not in err  # which only notes a GPU cluster's paths
    assert main(["grpo_qwen2.5-7b_1n8g", "--dry-run", "--remote-paths"]) == 0


def test_a_named_run_is_exported_so_the_job_continues_it(capsys, monkeypatch):
    """MEGATRON_RL_RUN_NAME set where `submit` runs: the job is told the name in its own command (a site
    that exports nothing by default, a command copied into another shell), so it continues that run."""
    monkeypatch.setenv("MEGATRON_RL_RUN_NAME", "grpo_tiny_cpu")
    assert main(["grpo_tiny_cpu", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    export = flags(shlex.split(out.splitlines()[0]))["export"].split(",")
    assert export[0] == "ALL" and "MEGATRON_RL_RUN_NAME=grpo_tiny_cpu" in export
    assert "run grpo_tiny_cpu (MEGATRON_RL_RUN_NAME): continues from its newest checkpoint in " in err
    monkeypatch.delenv("MEGATRON_RL_RUN_NAME")
    assert main(["grpo_tiny_cpu", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "MEGATRON_RL_RUN_NAME" not in out
    assert (
        "run grpo_tiny_cpu-<job id>: a run of its own; MEGATRON_RL_RUN_NAME=grpo_tiny_cpu makes it continue"
        in err
    )


@pytest.mark.parametrize("bad", ["a/b", "x,y", " pad", ".."])
def test_a_run_name_that_cannot_name_a_folder_is_refused(bad, capsys, monkeypatch):
    from megatron_rl.loop.record.names import run_name

    monkeypatch.setenv("MEGATRON_RL_RUN_NAME", bad)
    assert main(["grpo_tiny_cpu", "--dry-run"]) == 2
    assert "cannot name a run" in capsys.readouterr().err
    from megatron_rl.cli import launch_local

    assert launch_local.main(["grpo_tiny_cpu"]) == 2, "`megatron-rl run` refuses it before any rank starts"
    assert "cannot name a run" in capsys.readouterr().err
    with pytest.raises(ValueError, match="one folder name"):
        run_name(load_recipe("grpo_tiny_cpu"))


def test_a_fleet_the_job_starts_is_a_second_component_of_whole_cpu_nodes():
    fleet = ["reward.fleet_nodes=4", "reward.fleet_cpus_per_node=96", "reward.fleet_partition=cpu"]
    name = "grpo_qwen2.5-32b_32n8g"
    recipe = load_recipe(name, ["cluster.partition=gpu", "cluster.account=proj7", *fleet])
    cmd = sbatch_command(request_from_recipe(recipe), name, fleet, extra=["--qos=high"], cwd=REPO_ROOT)
    first, second = cmd[: cmd.index(":")], cmd[cmd.index(":") + 1 :]
    assert cmd.count(":") == 1 and second[-5:] == ["slurm/train.sbatch", name, *fleet]
    f, g = flags(first), flags(second[:-5])
    assert (f["nodes"], f["gpus-per-node"], f["partition"], f["qos"]) == ("32", "8", "gpu", "high")
    assert g == {
        "nodes": "4",
        "ntasks-per-node": "1",
        "cpus-per-task": "96",
        "time": recipe.cluster.time_limit,
        "partition": "cpu",
        "account": "proj7",
    }
    assert "--exclusive" in second and "--gpus-per-node" not in " ".join(second)
    # A fleet that already runs (its endpoints given) is the planner's to size, not the job's to start.
    given = load_recipe(name, [*fleet, "reward.endpoints=[cpu1:8471]"])
    assert ":" not in sbatch_command(request_from_recipe(given), name, [], cwd=REPO_ROOT)


def test_a_fleet_recipe_run_outside_its_job_is_refused_and_one_of_another_kind_everywhere():
    from megatron_rl.check.recipe import notes, refused

    own = check_recipe(load_recipe("grpo_tiny_cpu", ["reward.fleet_nodes=1"]))
    assert [p.key for p in refused(own, "validate")] == [] and notes(own, "validate") == []
    (p,) = [p for p in refused(own, "run") if p.key == "reward.fleet_nodes"]
    assert "megatron-rl submit" in p.message and "reward.fleet_nodes=0" in p.message
    started = check_recipe(load_recipe("grpo_tiny_cpu", ["reward.fleet_nodes=1", "reward.endpoints_file=f"]))
    assert "reward.fleet_nodes" not in [p.key for p in started]
    judged = ["reward.fleet_nodes=1", "reward.kind=http", "reward.url=http://judge:80"]
    (p,) = [p for p in refused(check_recipe(load_recipe("grpo_tiny_cpu", judged)), "validate")]
    assert p.key == "reward.fleet_nodes" and "kind=http" in p.message


def test_spare_nodes_are_asked_for_beside_the_runs_and_the_run_keeps_its_own(capsys):
    """cluster.spare_nodes adds nodes to the allocation only: the layout still fills cluster.nodes, which
    slurm/train.sbatch reads back to size the run's step (megatron-rl failover nodes)."""
    name = "grpo_qwen2.5-32b_32n8g"
    recipe = load_recipe(name, ["cluster.spare_nodes=2"])
    assert [p for p in check_recipe(recipe) if p.kind != "files"] == []
    f = flags(sbatch_command(request_from_recipe(recipe), name, [], cwd=REPO_ROOT))
    assert (f["nodes"], f["ntasks-per-node"]) == ("34", "8")
    assert main([name, "cluster.spare_nodes=2", "--dry-run", "--remote-paths"]) == 0
    err = capsys.readouterr().err
    assert "nodes: the run on 32, 2 spare (cluster.spare_nodes)" in err and "up to 3 restart(s)" in err
    bad = [p.key for p in check_recipe(load_recipe(name, ["cluster.spare_nodes=-1"]))]
    assert "cluster.spare_nodes" in bad
    assert "cluster.max_restarts" in [
        p.key for p in check_recipe(load_recipe(name, ["cluster.max_restarts=-2"]))
    ]
