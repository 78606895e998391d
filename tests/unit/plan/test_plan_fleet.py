"""The planner with a reward fleet (reward.fleet_nodes): its cores are the pool, and the node count it
says would keep up with generation is the one from which the scoring's exposure stops shrinking."""

from __future__ import annotations

import json

from megatron_rl.cli.plan import main
from megatron_rl.config.load import load_recipe
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.generation import generation
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.plan.scoring import scoring
from megatron_rl.run import resolve

RECIPE = "grpo_qwen2.5-32b_32n8g"


def _scoring(nodes: int) -> dict:
    recipe = load_recipe(RECIPE, [f"reward.fleet_nodes={nodes}", "reward.fleet_cpus_per_node=64"])
    inp = inputs_from_run(resolve(recipe))
    assert inp.work.pool_cores == nodes * 64
    return scoring(inp, generation(inp, ParallelLayout.from_config(recipe.layout)))


def test_the_nodes_that_keep_up_are_where_more_nodes_stop_helping():
    s = 8.0  # the recipe's reward.seconds_per_sample
    rows = {n: _scoring(n) for n in range(1, 12)}
    need = {r["fleet_nodes_to_keep_up"] for r in rows.values()}
    assert len(need) == 1
    need = need.pop()
    assert 1 < need < 11
    for n, r in rows.items():
        # below `need` the pool's waves end after generation's last sample's own s; from it on they do not
        assert (r["exposed_s"] > s + 1e-9) == (n < need), (n, r)
    assert rows[need - 1]["exposed_s"] > rows[need]["exposed_s"] == rows[11]["exposed_s"]


def test_plan_says_when_the_fleet_is_the_bottleneck(capsys):
    assert main([RECIPE, "reward.fleet_nodes=2", "--no-search"]) == 0
    out = capsys.readouterr().out
    assert "reward fleet: 2 nodes x 64 CPUs = 128 cores" in out and "THE FLEET IS THE BOTTLENECK" in out
    assert main([RECIPE, "reward.fleet_nodes=16", "--no-search"]) == 0
    out = capsys.readouterr().out
    assert "it keeps up with generation" in out and "BOTTLENECK" not in out
    assert main([RECIPE, "reward.fleet_nodes=2", "--no-search", "--json"]) == 0
    sc = json.loads(capsys.readouterr().out)["scoring"]
    assert sc["fleet_nodes"] == 2 and sc["fleet_cpus_per_node"] == 64 and sc["fleet_nodes_to_keep_up"] > 2
    assert main([RECIPE, "--no-search"]) == 0
    assert "reward fleet" not in capsys.readouterr().out  # no fleet, no line
