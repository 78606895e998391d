"""The planner models multi-turn rollouts: every turn is an environment run in the pool, and a
trajectory's turns wait on their environments in turn, so the engines idle at least turns x the run's
seconds per step; the plan says so."""

from __future__ import annotations

from megatron_rl.check.recipe import checked
from megatron_rl.config.load import load_recipe
from megatron_rl.plan.cycle import cycle
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.plan.render import render
from megatron_rl.plan.report import build_report


def _plan(*overrides):
    problems, run = checked(load_recipe("grpo_tiny_multiturn_cpu", list(overrides)), read_data=False)
    assert not problems, problems
    return inputs_from_run(run), run


def test_turns_multiply_the_environment_runs_and_the_engines_wait_on_them():
    inp1, run1 = _plan("rollout.max_turns=1")
    inp3, run3 = _plan("rollout.max_turns=3", "reward.seconds_per_sample=0.5")
    assert inp1.work.turns == 1 and inp3.work.turns == 3
    sc = cycle(inp3, run3.layout).scoring
    assert sc["turns"] == 3 and sc["core_seconds"] == inp3.work.samples * 3 * 0.5
    assert sc["exposed_s"] >= 3 * 0.5  # one trajectory's chain of environment calls, at least


def test_the_plan_says_where_the_engines_wait():
    inp, run = _plan("rollout.max_turns=3")
    text = render(build_report(inp, run.layout))
    assert "Environments and scoring (CPU pool), multi-turn" in text
    assert "x 3 turns" in text and "waiting on environments" in text
