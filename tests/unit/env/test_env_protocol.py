"""The environment protocol's safety net, name resolution, and the tool-call parser on malformed input."""

from __future__ import annotations

import math

import pytest

from megatron_rl.env.resolve import SHIPPED, environment_class
from megatron_rl.env.tool_calls import parse_tool_calls
from megatron_rl.env.types import ENV_ERROR, StepResult, Turn, start_safely, step_safely

TURN = Turn(index=0, ids=(5, 6), text="print(1)", last=False)


class _Raises:
    def step(self, turn):
        raise KeyError("the environment's own bug")


class _WrongType:
    def step(self, turn):
        return {"reward": 1.0}


class _NaN:
    def step(self, turn):
        return StepResult(reward=math.nan, done=True)


class _Fine:
    def step(self, turn):
        return StepResult(observation="ok", reward=0.5)


def test_an_environment_that_raises_ends_its_trajectory_with_reward_0_and_the_error():
    r = step_safely(_Raises(), TURN)
    assert (r.done, r.reward, r.status) == (True, 0.0, ENV_ERROR)
    assert "the environment's own bug" in r.info["error"] and "KeyError" in r.info["error"]


@pytest.mark.parametrize("episode", [_WrongType(), _NaN()])
def test_an_answer_that_is_not_a_step_result_or_a_nan_reward_is_an_env_error(episode):
    r = step_safely(episode, TURN)
    assert (r.done, r.reward, r.status) == (True, 0.0, ENV_ERROR)


def test_a_good_answer_passes_through_timed():
    r = step_safely(_Fine(), TURN)
    assert (r.observation, r.reward, r.done, r.status) == ("ok", 0.5, False, "")
    assert r.seconds >= 0.0


def test_start_that_raises_becomes_an_ending_result():
    class Broken:
        def start(self, prompt, problem):
            raise RuntimeError("no sandbox for you")

    r = start_safely(Broken(), None, None)
    assert isinstance(r, StepResult) and r.status == ENV_ERROR and "no sandbox" in r.info["error"]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_name_resolves_to_a_class_with_start(name):
    assert callable(environment_class(name).start)


def test_a_users_environment_by_module_and_class():
    assert environment_class("megatron_rl.env.code_feedback:CodeFeedback").__name__ == "CodeFeedback"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("codefeedback", "neither a shipped environment"),
        ("no_such_module_xyz:Env", "cannot import"),
        ("megatron_rl.env.types:Nope", "has no 'Nope'"),
        ("megatron_rl.env.types:ENV_ERROR", "not an environment class"),
        ("a:b:c", "neither a shipped environment"),
    ],
)
def test_unknown_environments_are_refused_with_the_reason(name, says):
    with pytest.raises(ValueError, match=says):
        environment_class(name)


def test_well_formed_tool_calls_parse_in_order():
    text = (
        'Let me check.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(2)\\"}"}</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert errors == []
    assert [c["arguments"]["code"] for c in calls] == ["print(1)", "print(2)"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'a "name"'),
        ('<tool_call>["python"]</tool_call>', 'a "name"'),
        ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "python", "arguments": "{oops"}</tool_call>', "string that is not JSON"),
        ('<tool_call>{"name": "python", "arguments": {"code": "1"}}', "not closed"),
    ],
)
def test_malformed_tool_calls_become_errors_never_exceptions(text, says):
    calls, errors = parse_tool_calls(text)
    assert calls == [] and any(says in e for e in errors), errors


def test_no_tool_call_is_a_final_answer():
    assert parse_tool_calls("def f():\n    return 1\n") == ([], [])
