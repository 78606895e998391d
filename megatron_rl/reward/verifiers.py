"""In-process rewards: plain Python functions for trusted, cheap checks (a math answer, a format).

A recipe names one as `reward.kind=function reward.function=module:function`. It runs in the trainer's
process, without a sandbox, so it must never execute the completion: it only reads it. Signature:

    def my_reward(problem: Problem, completion: str) -> float | bool | RewardResult

A float or bool becomes a `RewardResult` with status `passed` when the reward is at least 1 and
`failed` otherwise; an exception becomes `crashed` with the traceback's tail.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from megatron_rl.reward.extract import extract_code

Verifier = Callable[[Any, str], Any]


def load_verifier(spec: str) -> Verifier:
    """The function named by "module:function", with an error that says what is wrong."""
    from megatron_rl.config.named import import_named, is_named

    if not is_named(spec):
        raise ValueError(
            f"reward.function must be 'module:function' (e.g. 'megatron_rl.reward.verifiers:math_answer'); got {spec!r}"
        )
    func = import_named(spec, "reward.function")
    if not callable(func):
        raise TypeError(
            f"reward.function {spec!r}: {spec.split(':')[1]!r} is a {type(func).__name__}, not a function"
        )
    return func


# ---- math answers ------------------------------------------------------------------------------

_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\$?([^\n$]+?)\$?\s*(?:\.|$)", re.I | re.M)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def final_answer(completion: str) -> str | None:
    """The answer a completion commits to: the last \\boxed{}, else "the answer is X", else the last number."""
    text = completion.rsplit("</think>", 1)[-1]
    found = boxed(text)
    if found is None:
        matches = _ANSWER_IS.findall(text)
        found = matches[-1] if matches else None
    if found is None:
        numbers = _NUMBER.findall(text)
        found = numbers[-1] if numbers else None
    return found.strip() if found is not None else None


def _normalise(answer: str) -> str:
    answer = answer.strip().rstrip(".").strip("$").rstrip(".").replace(" ", "").replace("\\!", "")
    answer = re.sub(r"^\\text\{(.*)\}$", r"\1", answer)
    return re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", answer)


def _as_number(answer: str) -> Fraction | float | None:
    """Integers and ratios exactly (as Fractions); decimals as floats, since 0.333333 means 1/3."""
    text = _normalise(answer).replace(",", "")
    if "." not in text:
        try:
            return Fraction(text)
        except (ValueError, ZeroDivisionError):
            pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answers_match(predicted: str, expected: str) -> bool:
    """Numerically equal (exactly for fractions, to 1e-6 relative for decimals) or equal once normalised."""
    a, b = _as_number(predicted), _as_number(expected)
    if a is not None and b is not None:
        if isinstance(a, Fraction) and isinstance(b, Fraction):
            return a == b
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    return _normalise(predicted).lower() == _normalise(expected).lower()


def math_answer(problem: Any, completion: str) -> float:
    """1.0 when the completion's final answer matches `problem.answer`, else 0.0."""
    if not problem.answer:
        raise ValueError(f"problem {problem.id!r} has no 'answer'; math_answer needs one")
    predicted = final_answer(completion)
    return 1.0 if predicted is not None and answers_match(predicted, problem.answer) else 0.0


def python_format(problem: Any, completion: str) -> float:
    """1.0 when the completion holds a Python block that defines the problem's entry point (if it has one).

    A shaping reward for the first steps of training, before programs pass any test; it reads the
    code but never runs it.
    """
    code = extract_code(completion, problem.entry_point)
    if code is None:
        return 0.0
    if problem.entry_point and not re.search(
        rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(problem.entry_point)}\b", code, re.M
    ):
        return 0.0
    return 1.0


def fixed_latency(problem: Any, completion: str) -> float:
    """`math_answer` after a fixed pause (MEGATRON_RL_VERIFIER_LATENCY_S seconds, default 0.05): a
    verifier that takes as long as a slow one without using a core, so a reward fleet's scaling can be
    measured on a small machine (benchmarks/reward_fleet.py)."""
    import os
    import time

    time.sleep(float(os.environ.get("MEGATRON_RL_VERIFIER_LATENCY_S", "0.05")))
    return math_answer(problem, completion)
