"""A run's name, decided once: the launcher passes it to every rank so they share one run directory.

The name is the folder of everything the run writes: `<logger.run_dir>/<name>/` (log, records, samples,
W&B files) and `<checkpoint.dir>/<name>/` (its checkpoints). A run started under a name that already has
checkpoints continues from the newest one (`checkpoint.resume=auto`), which is how a requeued job, a rerun
and a Slurm job continuing a local run (`megatron-rl submit` passes MEGATRON_RL_RUN_NAME on) pick up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV = "MEGATRON_RL_RUN_NAME"


def run_name(recipe, env: Mapping[str, str] | None = None) -> str:
    """MEGATRON_RL_RUN_NAME if set, else `<recipe>-<slurm job id>` under Slurm, else the recipe's name."""
    env = os.environ if env is None else env
    if env.get(ENV):
        return checked_name(env[ENV])
    job = env.get("SLURM_JOB_ID")
    return f"{recipe.name}-{job}" if job else recipe.name


def checked_name(name: str) -> str:
    """`name` when it can name one folder and travel in sbatch's `--export` list; a ValueError that says
    what is wrong otherwise (a '/' would nest the run's folders, a ',' splits the export list)."""
    if name in (".", "..") or name != name.strip() or not name.isprintable() or any(c in name for c in "/,"):
        raise ValueError(
            f"{ENV}={name!r} cannot name a run: it is one folder name (no '/' or ',', no spaces at either end)"
        )
    return name
