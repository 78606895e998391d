"""Rank bootstrap shared by torchrun and Slurm: one mapping from the launcher's environment to ranks.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. `srun` (one task per GPU)
sets SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_NODELIST instead. Both lead to the same
`DistEnv`, so the trainer never asks which launcher started it. Pure: no torch import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | single

    @property
    def node_rank(self) -> int:
        return self.rank // max(self.local_world_size, 1)

    def export(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """Write the torchrun-style variables (what torch.distributed's env:// init reads)."""
        env = os.environ if env is None else env
        env.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )
        return env


def first_host(nodelist: str) -> str:
    """The first host of a Slurm nodelist: 'gpu[003-005,010],cpu1' -> 'gpu003'."""
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot parse SLURM_JOB_NODELIST={nodelist!r}")
    prefix, _, ranges = m.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _port_from_job(job_id: str) -> int:
    # A port per job id keeps two jobs that share a node from colliding.
    return 20000 + int(job_id) % 20000 if job_id.isdigit() else DEFAULT_PORT


def from_env(env: Mapping[str, str] | None = None) -> DistEnv:
    """Ranks from torchrun's variables if set, else Slurm's, else a single process."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return DistEnv(
            rank=int(env["RANK"]),
            world_size=world,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", DEFAULT_PORT)),
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
        per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        local_world = int(per_node) if per_node.isdigit() else max(world // max(nodes, 1), 1)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            local_world_size=local_world,
            master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
            master_port=int(env.get("MASTER_PORT") or _port_from_job(env.get("SLURM_JOB_ID", ""))),
            launcher="slurm",
        )
    return DistEnv(
        0, 1, 0, 1, env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", DEFAULT_PORT)), "single"
    )
