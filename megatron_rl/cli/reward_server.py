"""`megatron-rl reward-server`: serve this node's sandboxes to a training job over HTTP.

    MEGATRON_RL_REWARD_TOKEN=... megatron-rl reward-server [--host H] [--port P] [--workers N]
                                 [--queue Q] [--port-file F] [--timeout-s S] [--memory-mb M]
                                 [--mode fraction] [--function module:fn] [--unsafe-local]
                                 [RECIPE [key=value ...]]

One process per CPU node, started by `slurm/train.sbatch` (or by hand). `--workers` sandboxes (one per
CPU by default) score what the job's engine leaders send; the endpoints and their guarantees are
`megatron_rl/reward/server.py`'s docstring. `--port 0` takes a free port; `--port-file` receives
"host:port" once it listens, for a job that lists its fleet from such files (`reward.endpoints_file`).
With a RECIPE (and its overrides) the server scores as that recipe's reward group says (kind, function,
mode, limits), which is what the recipe's ranks check on /health; the reward options then stay unset.
Exit code 2 on bad input (one line on stderr), 1 when the sandbox cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from megatron_rl.cli.score import _host_memory_mb, _in_range, _Parser, add_reward_options, reward_config
from megatron_rl.config.schema import RewardConfig


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="megatron-rl reward-server", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="0.0.0.0", help="interface to listen on (default: all)")
    p.add_argument("--port", type=int, default=8471, help="TCP port (0: a free one)")
    p.add_argument(
        "--workers", type=_in_range("reward.workers", int), default=None, help="sandboxes (default: CPUs)"
    )
    p.add_argument(
        "--queue", type=int, default=None, help="jobs queued or running before 503 (default: 4 x workers)"
    )
    p.add_argument("--port-file", default="", help="write host:port here once listening")
    add_reward_options(p)
    p.add_argument("recipe", nargs="?", default="", help="score as this recipe's reward group says")
    p.add_argument("overrides", nargs="*", help="the recipe's overrides, e.g. reward.mode=fraction")
    return p


# The options a recipe's reward group sets instead (add_reward_options).
REWARD_FLAGS = ("--mode", "--timeout-s", "--memory-mb", "--function", "--unsafe-local")


def recipe_reward(args: argparse.Namespace, argv: list[str], workers: int) -> RewardConfig:
    """The reward group of the recipe the server was given, as a server scores it: its own sandboxes (a
    recipe's endpoints are the fleet's clients' business), no reward model (the trainer runs it).
    ValueError naming what is wrong."""
    from dataclasses import replace

    from megatron_rl.config.load import load_recipe

    given = [f for f in REWARD_FLAGS if any(a == f or a.startswith(f + "=") for a in argv)]
    if given:
        raise ValueError(
            f"give a recipe or {', '.join(given)}, not both: the recipe's reward group sets them"
        )
    try:
        r = load_recipe(args.recipe, args.overrides).reward
    except Exception as e:  # RecipeNotFound, Hydra's unknown key or wrong type: one line either way
        raise ValueError(f"recipe {args.recipe!r} does not compose: {e}") from None
    if r.kind not in ("sandbox", "function"):
        raise ValueError(f"a reward server scores reward.kind=sandbox or function; recipe {args.recipe!r} "
                         f"has kind={r.kind}")  # fmt: skip
    if r.memory_mb > _host_memory_mb():
        raise ValueError(
            f"reward.memory_mb={r.memory_mb} is more than this machine's {_host_memory_mb()} MiB"
        )
    return replace(r, endpoints=[], endpoints_file="", model_checkpoint="", workers=workers)


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    from megatron_rl.reward.server import TOKEN_ENV, ScoreService, serve

    token = os.environ.get(TOKEN_ENV, "")
    if not 0 <= args.port <= 65535:
        print(f"megatron-rl reward-server: --port must be 0-65535; got {args.port}", file=sys.stderr)
        return 2
    if args.queue is not None and args.queue < 1:
        print(f"megatron-rl reward-server: --queue must be at least 1; got {args.queue}", file=sys.stderr)
        return 2
    try:
        ScoreService.check_token(token)
    except ValueError as e:
        print(f"megatron-rl reward-server: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    from megatron_rl.reward.pool import RewardPool
    from megatron_rl.reward.sandbox import SandboxUnavailable, default_workers

    workers = args.workers or default_workers()
    try:
        cfg = recipe_reward(args, argv, workers) if args.recipe else reward_config(args, workers)
    except ValueError as e:
        print(f"megatron-rl reward-server: {e}", file=sys.stderr)
        return 2
    try:
        pool = RewardPool(cfg)
    except (SandboxUnavailable, ValueError, ImportError, AttributeError) as e:
        print(f"megatron-rl reward-server: {e}", file=sys.stderr)
        return 1
    capacity = args.queue or 4 * workers

    where = []

    def ready(address: str) -> None:
        where.append(address)
        print(
            f"reward-server listening on http://{address} ({workers} {cfg.kind} workers, queue {capacity})",
            flush=True,
        )

    try:
        scored = serve(pool, token, args.host, args.port, capacity, args.port_file, ready)
        print(f"reward-server on {where[0]} stopped after scoring {scored} samples", flush=True)
    except OSError as e:
        print(f"megatron-rl reward-server: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    finally:
        pool.close()
    return 0
