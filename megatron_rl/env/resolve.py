"""`rollout.env` to an environment class: a shipped name, or a user's own as `module:Class`.

One room for the rule: `validate` (check/rules.py) and the engine leaders (loop/step/collect.py) both
resolve through `environment_class`, so an environment `validate` accepts is the one that runs.
"""

from __future__ import annotations

SHIPPED = {
    "code_feedback": "megatron_rl.env.code_feedback:CodeFeedback",
    "expression_feedback": "megatron_rl.env.code_feedback:ExpressionFeedback",
    "tool_calls": "megatron_rl.env.tool_calls:ToolCalling",
}


def environment_class(name: str) -> type:
    """The class `rollout.env` names; ValueError saying what is wrong and what is accepted."""
    from megatron_rl.config.named import import_named, is_named

    spec = SHIPPED.get(name, name)
    if not is_named(spec):
        raise ValueError(
            f"rollout.env={name!r} is neither a shipped environment ({', '.join(SHIPPED)}) nor "
            "'module:Class' (your own: a class taking an EnvContext, with start(prompt, problem))"
        )
    try:
        cls = import_named(spec, "rollout.env")
    except (ImportError, AttributeError) as e:
        raise ValueError(str(e)) from None
    if not isinstance(cls, type) or not callable(getattr(cls, "start", None)):
        raise ValueError(
            f"rollout.env={name!r}: {spec.split(':')[1]!r} is not an environment class (a class with a method "
            "start(prompt, problem) returning an episode with step(turn))"
        )
    return cls
