"""Multi-turn recipes: `validate` refuses an unknown environment and every combination the turn scheduler
does not support, naming the key; the shipped multi-turn recipe passes."""

from __future__ import annotations

import pytest

from megatron_rl.check.recipe import check_recipe
from megatron_rl.config.load import load_recipe


def _keys(recipe: str, *overrides: str) -> dict[str, str]:
    return {p.key: p.message for p in check_recipe(load_recipe(recipe, list(overrides)), read_data=False)}


def test_the_multiturn_recipe_validates():
    assert _keys("grpo_tiny_multiturn_cpu") == {}


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["rollout.env=no_such_env"], "rollout.env", "neither a shipped environment"),
        (["rollout.env=not_a_module_xyz:Env"], "rollout.env", "cannot import"),
        (["rollout.partial=true", "rollout.oversample=2"], "rollout.partial", "does not continue multi-turn"),
        (["layout.engine_tp=2", "layout.engine_count=1"], "layout.engine_tp", "in lockstep"),
        (["rollout.turn_max_tokens=100"], "rollout.turn_max_tokens", "caps the whole trajectory"),
        (["rollout.env=", "rollout.max_turns=3"], "rollout.max_turns", "set rollout.env"),
        (["rollout.env=", "rollout.max_turns=1"], "data.hidden_target", "only a multi-turn environment"),
        (["rollout.max_turns=0"], "rollout.max_turns", ""),
    ],
)
def test_what_multi_turn_cannot_run_is_refused_by_key(overrides, key, says):
    problems = _keys("grpo_tiny_multiturn_cpu", *overrides)
    assert key in problems and says in problems[key], problems


def test_expression_feedback_needs_the_synthetic_task():
    problems = _keys("grpo_tiny_hf_cpu", "rollout.env=expression_feedback", "rollout.max_turns=2")
    assert "the synthetic task's" in problems["rollout.env"]


def test_routing_replay_with_an_environment_is_refused():
    problems = _keys(
        "grpo_tiny_moe_cpu",
        "rollout.env=code_feedback",
        "rollout.max_turns=2",
        "algorithm.routing_replay=true",
    )
    assert "multi-turn" in problems["algorithm.routing_replay"], problems


def test_the_python_tool_needs_the_sandbox():
    problems = _keys(
        "grpo_tiny_hf_cpu",
        "rollout.env=tool_calls",
        "reward.kind=function",
        "reward.function=megatron_rl.reward.verifiers:math_answer",
    )
    assert "needs reward.kind=sandbox" in problems["rollout.env"], problems
