"""How a publication reaches a colocated engine, and the sleep level that follows from it.

Two deliveries (reshard/publish.py):
- "inplace" (GPU): the reshard writes this rank's slice straight into vLLM's live parameters;
- "loader" (vLLM's CPU build, which repacks its linear weights): full HF-named tensors through
  vLLM's weight loader.

Both overwrite every engine weight at every step. What the engine does with its weights while it
sleeps follows from that: level 1 copies them to pinned host memory and back (17.6 GB per GPU at
70B, each way, each step) only for the publication to overwrite them, so in-place delivery sleeps
at level 2 (discard). Loader delivery keeps level 1: it runs where sleep frees nothing anyway.
The price of level 2: a refused publication leaves no version to serve (loop/placement/publication.py), so
`rollout.on_refused_publication=skip` needs level 1 (the recipe check, megatron_rl/check/recipe.py, refuses it at level 2).

Pure (no torch): the planner reads the same rule the loop applies.
"""

from __future__ import annotations

DELIVERIES = ("inplace", "loader")
SLEEP_LEVELS = (0, 1, 2)  # 0 = chosen by delivery


def delivery_for(on_gpu: bool) -> str:
    """The delivery the loop uses: in place on GPU, through the loader on the CPU build."""
    return "inplace" if on_gpu else "loader"


def sleep_level_for(requested: int, delivery: str) -> int:
    """The engine's sleep level: the recipe's `rollout.sleep_level` when set (1 or 2), else (0) the one
    the delivery calls for: 2 with in-place delivery, 1 with loader delivery."""
    if requested not in SLEEP_LEVELS:
        raise ValueError(
            f"rollout.sleep_level must be one of {SLEEP_LEVELS} (0 = chosen by delivery); got {requested}"
        )
    if delivery not in DELIVERIES:
        raise ValueError(f"delivery must be one of {DELIVERIES}; got {delivery!r}")
    if requested:
        return requested
    return 2 if delivery == "inplace" else 1
