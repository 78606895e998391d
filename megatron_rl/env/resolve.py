"""`rollout.env` to an environment class: a shipped name, or a user's own as `module:Class`.

One room for the rule: `validate` (check/rules.py) and the engine leaders (loop/step/collect.py) both
resolve through `environment_class`, so an environment `validate` accepts is the one that runs.
"""

from __future__ import annotations

import importlib

SHIPPED = {
    "code_feedback": "megatron_rl.env.code_feedback:CodeFeedback",
    "expression_feedback": "megatron_rl.env.code_feedback:ExpressionFeedback",
    "tool_calls": "megatron_rl.env.tool_calls:ToolCalling",
}


def environment_class(name: str) -> type:
    """The class `rollout.env` names; ValueError saying what is wrong and what is accepted."""
    spec = SHIPPED.get(name, name)
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(
            f"rollout.env={name!r} is neither a shipped environment ({', '.join(SHIPPED)}) nor "
            "'module:Class' (your own: a class taking an EnvContext, with start(prompt, problem))"
        )
    module_name, cls_name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"rollout.env={name!r}: cannot import {module_name!r} ({e}); is it on PYTHONPATH?"
        ) from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ValueError(f"rollout.env={name!r}: module {module_name!r} has no {cls_name!r}")
    if not isinstance(cls, type) or not callable(getattr(cls, "start", None)):
        raise ValueError(
            f"rollout.env={name!r}: {cls_name!r} is not an environment class (a class with a method "
            "start(prompt, problem) returning an episode with step(turn))"
        )
    return cls
