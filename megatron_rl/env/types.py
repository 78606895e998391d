"""The environment protocol: what a trajectory's environment is given and what it answers.

An environment sees text, not tokens: the model's turn decoded (`Turn.text`, with the ids it came
from), and it answers with text (`StepResult.observation`), which the scheduler renders through the
model's chat template and appends as tokens (env/render.py). One reward per trajectory: the reward of
the step that ends it (`done`, or the last turn `rollout.max_turns` allows).

An episode that raises must not take the run with it: `step_safely` turns any exception into a
`StepResult` that ends the trajectory with reward 0, status `env_error` and the error's last lines,
which the step's samples.jsonl keeps.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from megatron_rl.reward.result import ENV_ERROR


@dataclass(frozen=True)
class Turn:
    """One model turn: its token ids as the engine produced them and their text."""

    index: int  # 0 for the first turn
    ids: tuple[int, ...]
    text: str
    last: bool  # no further turn follows (rollout.max_turns, or the trajectory's cap), whatever the answer
    truncated: bool = False  # the turn ran into its cap (rollout.turn_max_tokens) without its end token


@dataclass
class StepResult:
    """An environment's answer to one turn.

    `observation`: the text the model reads next (a test failure, a tool's output); ignored when done.
    `reward`: the trajectory's reward if this step ends it. `status`: one of reward/result.py's STATUSES
    for the step that ends the trajectory ("" becomes passed/failed from the reward). `role`: the chat
    role the observation is rendered as (tool output is "tool"; feedback is "user")."""

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    status: str = ""
    role: str = "user"
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # filled by step_safely: the environment's wall time for this step


@runtime_checkable
class Episode(Protocol):
    """One trajectory's environment state."""

    def step(self, turn: Turn) -> StepResult: ...


@runtime_checkable
class Environment(Protocol):
    """Starts an episode per trajectory. Constructed once per engine leader with an `EnvContext`;
    `start` and every episode's `step` are called from worker threads, several at once."""

    def start(self, prompt: Any, problem: Any) -> Episode: ...


@dataclass
class EnvContext:
    """What an environment may use: the engine leader's reward pool (sandboxed runs, `RewardPool.call`
    and `run_program`), the task (its problems; `decode`), and the recipe's rollout settings."""

    pool: Any
    task: Any
    max_turns: int
    observation_max_chars: int = 4000
    options: dict[str, Any] = field(default_factory=dict)


def step_safely(episode: Episode, turn: Turn) -> StepResult:
    """`episode.step(turn)`, timed; an exception (or an answer that is not a StepResult) ends the
    trajectory with reward 0 and status env_error, recording what went wrong."""
    t0 = time.perf_counter()
    try:
        result = episode.step(turn)
        if not isinstance(result, StepResult):
            raise TypeError(
                f"{type(episode).__name__}.step returned {type(result).__name__}, not a StepResult"
            )
        if not isinstance(result.observation, str):
            raise TypeError(
                f"{type(episode).__name__}.step's observation is a {type(result.observation).__name__}, not text"
            )
        reward = float(result.reward)
        if reward != reward:
            raise ValueError(f"{type(episode).__name__}.step returned a NaN reward")
        result.reward = reward
    except Exception as e:
        tail = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])[-1500:]
        result = StepResult(reward=0.0, done=True, status=ENV_ERROR, info={"error": tail})
    result.seconds = time.perf_counter() - t0
    return result


def start_safely(env: Environment, prompt: Any, problem: Any) -> Episode | StepResult:
    """`env.start(...)`, or the StepResult that ends the trajectory when starting raised."""
    try:
        return env.start(prompt, problem)
    except Exception as e:
        tail = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])[-1500:]
        return StepResult(reward=0.0, done=True, status=ENV_ERROR, info={"error": tail})
