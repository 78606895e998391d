"""Execution feedback: run the turn's code against the problem's tests, answer with what failed.

`code_feedback` is the coding environment: each turn's code goes through the same sandboxed grader
as a single-turn sample (reward/pool.py `call`), and a turn that does not pass reads the grader's
failure report (the failing assertions, the interpreter's error, what the program printed; cut to
`rollout.observation_max_tokens`, keeping the end) and may revise, up to `rollout.max_turns`. The
trajectory's reward is that of its last turn, so a program fixed after feedback earns what a program
right the first time does (a per-turn cost is `rollout.turn_penalty`).

`expression_feedback` is the tiny task's (data.source=synthetic, data.hidden_target): the prompt
does not show the target, so the first turn can only guess; the feedback says what the expression
evaluated to and what the test expected, as a failing `assert ans == 12` would, and the next turn can
correct itself. Written in the task's own characters ("15=12=").
"""

from __future__ import annotations

from megatron_rl.env.types import EnvContext, StepResult, Turn
from megatron_rl.reward.result import PASSED


def clipped(text: str, limit: int) -> str:
    """The end of `text`, at most `limit` characters (the token budget cuts again, render.py)."""
    return text if len(text) <= limit else "[...]" + text[-limit:]


class CodeFeedback:
    """Each turn graded in the sandbox; the failures are the next observation. The trajectory's reward
    is its last turn's."""

    def __init__(self, ctx: EnvContext):
        self.ctx = ctx

    def start(self, prompt, problem) -> _CodeEpisode:
        return _CodeEpisode(self, problem)

    def feedback(self, result, turn: Turn, problem=None) -> str:
        counted = (
            f", {result.tests_passed} of {result.tests_total} tests passed" if result.tests_total else ""
        )
        report = clipped(result.output_tail.strip(), self.ctx.observation_max_chars)
        return (
            f"Your program did not pass ({result.status}{counted}).\n{report}\n"
            "Fix it and answer with the whole program."
        )

    def program(self, turn: Turn) -> str:
        return turn.text


class _CodeEpisode:
    def __init__(self, env: CodeFeedback, problem):
        self.env, self.problem = env, problem

    def step(self, turn: Turn) -> StepResult:
        result = self.env.ctx.pool.call(self.problem, self.env.program(turn))
        done = result.status == PASSED or turn.last
        observation = "" if done else self.env.feedback(result, turn, self.problem)
        return StepResult(
            observation, result.reward, done, result.status, info={"tests": result.tests_passed}
        )


class ExpressionFeedback(CodeFeedback):
    """The tiny task's feedback: the value the expression had, then the target, in the task's characters."""

    def program(self, turn: Turn) -> str:
        return self.ctx.task.program(list(turn.ids)) + "print(ans)\n"

    def feedback(self, result, turn: Turn, problem=None) -> str:
        lines = result.output_tail.strip().splitlines()
        value = lines[0].strip() if lines else ""
        shown = value[-12:] if value.lstrip("-").isdigit() else ""  # no value: not an integer expression
        return f"{shown}={problem.answer}="
