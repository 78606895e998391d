"""A run's name, decided once: the launcher passes it to every rank so they share one run directory."""

from __future__ import annotations

import os
from collections.abc import Mapping


def run_name(recipe, env: Mapping[str, str] | None = None) -> str:
    """MEGATRON_RL_RUN_NAME if set, else `<recipe>-<slurm job id>` under Slurm, else the recipe's name."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    return env.get("MEGATRON_RL_RUN_NAME") or (f"{recipe.name}-{job}" if job else recipe.name)
