"""Tool calling in the Qwen/Hermes chat format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

A turn that holds tool calls gets their results as the next observation, one `tool` message (the chat
template wraps it, e.g. Qwen's `<tool_response>`); a turn without one is the final answer, graded
by the problem's tests in the sandbox. One tool ships: `python` (argument `code`), run in the same
sandbox as the grader, with its limits, answering with what the program printed and any error.

Malformed calls never crash a trajectory: JSON that does not parse, a call with no name, an unknown
tool, a missing argument or an unclosed tag each become an observation that says what is wrong, so
the model can see its mistake (and is not rewarded for it: only the final answer is graded).
"""

from __future__ import annotations

import json
import re

from megatron_rl.env.code_feedback import clipped
from megatron_rl.env.types import EnvContext, StepResult, Turn

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
MAX_CALLS_PER_TURN = 4


def parse_tool_calls(text: str) -> tuple[list[dict], list[str]]:
    """(well-formed calls, errors), in order. A call is {"name": str, "arguments": dict}."""
    calls, errors = [], []
    for body in _CALL.findall(text):
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError as e:
            errors.append(f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append('a tool call must be a JSON object with a "name" and "arguments"')
            continue
        args = call.get("arguments", {})
        if isinstance(args, str):  # some templates serialise arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                errors.append(f"the arguments of tool {call['name']!r} are a string that is not JSON")
                continue
        if not isinstance(args, dict):
            errors.append(f"the arguments of tool {call['name']!r} must be a JSON object")
            continue
        calls.append({"name": call["name"], "arguments": args})
    if text.count("<tool_call>") > text.count("</tool_call>"):
        errors.append("a <tool_call> is not closed with </tool_call>")
    return calls, errors


class ToolCalling:
    """The python tool in the sandbox; the final answer (a turn without calls) graded by the tests."""

    tools = ("python",)

    def __init__(self, ctx: EnvContext):
        self.ctx = ctx

    def start(self, prompt, problem) -> _ToolEpisode:
        return _ToolEpisode(self, problem)

    def run(self, call: dict) -> str:
        if call["name"] not in self.tools:
            return f"error: unknown tool {call['name']!r}; the tools are {', '.join(self.tools)}"
        code = call["arguments"].get("code")
        if not isinstance(code, str) or not code.strip():
            return 'error: the python tool needs an argument "code" holding the program'
        result = self.ctx.pool.run_program(code)
        out = clipped(result.output_tail.strip(), self.ctx.observation_max_chars)
        return out if result.status == "passed" else f"{out}\n({result.status})".strip()


class _ToolEpisode:
    def __init__(self, env: ToolCalling, problem):
        self.env, self.problem = env, problem

    def step(self, turn: Turn) -> StepResult:
        calls, errors = parse_tool_calls(turn.text)
        if (not calls and not errors) or turn.last:
            result = self.env.ctx.pool.call(self.problem, turn.text)
            return StepResult("", result.reward, True, result.status, info={"tool_calls": len(calls)})
        answers = [f"error: {e}" for e in errors]
        answers += [self.env.run(c) for c in calls[:MAX_CALLS_PER_TURN]]
        if len(calls) > MAX_CALLS_PER_TURN:
            answers.append(f"error: at most {MAX_CALLS_PER_TURN} tool calls a turn; the rest were not run")
        return StepResult("\n".join(answers), 0.0, False, role="tool", info={"tool_calls": len(calls)})
