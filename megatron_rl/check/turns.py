"""The multi-turn rules (rollout.env: rollout/turns.py), each naming the key it refuses.

An environment `validate` accepts is the one the engine leaders build: both resolve it through
env/resolve.py. What multi-turn does not combine with is refused with the reason, before anything runs:
partial rollouts (a trajectory cut between turns would need its episode's state carried in the
checkpoint), routing replay (the engine records routes per request, not across a trajectory's turns),
engines of TP > 1 (their ranks would need every observation in lockstep).
"""

from __future__ import annotations

from megatron_rl.check.ranges import get_key
from megatron_rl.config.problem import Problem


def _problem(run, key: str, message: str) -> Problem:
    return Problem(key, get_key(run.recipe, key), message, "recipe")


def environment(run) -> list[Problem]:
    from megatron_rl.env.resolve import environment_class

    cfg, out = run.recipe, []
    ro, d = cfg.rollout, cfg.data
    if not ro.env:
        if ro.max_turns > 1:
            out.append(
                _problem(
                    run, "rollout.max_turns", "> 1 needs an environment to answer the turns: set rollout.env"
                )
            )
        if d.hidden_target:
            out.append(
                _problem(
                    run,
                    "data.hidden_target",
                    "hides the target from the prompt: only a multi-turn environment's feedback can tell it "
                    "(rollout.env=expression_feedback rollout.max_turns=2 or more)",
                )
            )
        return out
    try:
        environment_class(ro.env)
    except ValueError as e:
        out.append(_problem(run, "rollout.env", str(e)))
    if ro.env == "tool_calls" and cfg.reward.kind != "sandbox":
        out.append(
            _problem(
                run,
                "rollout.env",
                f"tool_calls runs its python tool in the sandbox: it needs reward.kind=sandbox (got {cfg.reward.kind})",
            )
        )
    if ro.env == "expression_feedback" and d.source != "synthetic":
        out.append(
            _problem(
                run, "rollout.env", "expression_feedback is the synthetic task's; set data.source=synthetic"
            )
        )
    if d.hidden_target and d.source != "synthetic":
        out.append(_problem(run, "data.hidden_target", "applies to data.source=synthetic only"))
    if ro.partial:
        out.append(
            _problem(
                run,
                "rollout.partial",
                "does not continue multi-turn trajectories (an episode's state between turns is not carried "
                "over a batch): set rollout.partial=false with rollout.env",
            )
        )
    if cfg.algorithm.routing_replay:
        out.append(
            _problem(
                run,
                "algorithm.routing_replay",
                "does not cover multi-turn trajectories yet (the engine records routes per request, not across "
                "a trajectory's turns): set it false with rollout.env",
            )
        )
    if run.layout.engine_tp > 1:
        out.append(
            _problem(
                run,
                "layout.engine_tp",
                f"= {run.layout.engine_tp}: multi-turn runs its environments on the engine leader, and the ranks "
                "of a TP engine would need every observation in lockstep: use engine_tp=1 with rollout.env "
                "(more engines instead)",
            )
        )
    if ro.turn_max_tokens > ro.max_new_tokens:
        out.append(
            _problem(
                run,
                "rollout.turn_max_tokens",
                f"exceeds rollout.max_new_tokens={ro.max_new_tokens}, which caps the whole trajectory (turns "
                "and observations) with rollout.env",
            )
        )
    return out
