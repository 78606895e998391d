"""What an engine can serve: the one rule, which `validate` (check/recipe.py) applies to a recipe before
anything starts and the engine (vllm_engine.py) applies to itself as it is built. On vLLM's CPU build:

- expert-parallel engines (`layout.engine_ep`) are a GPU feature of vLLM;
- a mixture-of-experts engine runs at engine TP 1: after each publication the engine repacks the
  experts vLLM's CPU reload leaves raw (moe_reload.py), built and tested for whole experts per engine;
On any build, recorded routes (routing replay) need a mixture-of-experts model: a dense one routes
nothing.
Pure: the planner and the check import it without torch or vLLM.
"""

from __future__ import annotations


def engine_problems(
    on_gpu: bool, num_experts: int, engine_tp: int, expert_parallel: bool, record_routes: bool = False
) -> list[tuple[str, str]]:
    """(recipe key, what is wrong and how to fix it) for every way these engines cannot run."""
    out = []
    if record_routes and not num_experts:
        out.append(
            (
                "algorithm.routing_replay",
                "replays the experts the engine routed each token to: this model is dense, it has no experts",
            )
        )
    if on_gpu:
        return out
    if expert_parallel:
        out.append(
            (
                "layout.engine_ep",
                "is for GPU engines (vLLM's CPU build has no expert-parallel engines, and its MoE engine runs "
                "at engine TP 1); set it false",
            )
        )
    if num_experts and engine_tp > 1:
        out.append(
            (
                "layout.engine_tp",
                "must be 1 for a mixture-of-experts model on the CPU build: after each publication the engine "
                "repacks the experts vLLM's CPU reload leaves raw (rollout/moe_reload.py), which is built and "
                "tested for whole experts per engine; use layout.engine_count for more engines",
            )
        )
    return out
