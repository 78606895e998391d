"""Scoring in the CPU pool, and how much of it hides behind generation when completions stream.

Unstreamed, the pool scores the whole batch after generation: ceil(N / cores) waves of
`seconds_per_sample`. Streamed, each completion goes to the pool as it finishes. The bulk of the
completions finish between the end of prefill (t0) and the end of the bulk decode (t1); taking
them as arriving evenly over that window, the pool is done with them at max(t1 + s, t0 + waves·s)
(it either keeps up, or works off a backlog from t0 on). The longest completion finishes with
generation and needs its own s. Whatever ends after generation is exposed; the rest is hidden.

Multi-turn (rollout.env, `turns` T > 1): every turn of every trajectory is one environment run of s in
the pool (T x N runs), and a trajectory's turns are sequential: each waits on its environment before
the engine can take its next turn. The engines then sit idle at least T x s per step (one trajectory's
chain of environment calls; more when the pool's T x N runs do not fit in the generation window), and
that idle time is what is exposed. In a run it shows inside the generation phase
(`generation.env_wait_s`); here it is the exposed part of scoring, where devices wait on CPUs.
"""

from __future__ import annotations

import math

from megatron_rl.plan.generation import Generation
from megatron_rl.plan.inputs import PlanInputs


def scoring(inp: PlanInputs, gen: Generation) -> dict:
    w = inp.work
    s = w.seconds_per_sample
    if w.turns > 1:
        runs = w.samples * w.turns
        waves = math.ceil(runs / w.pool_cores)
        serial = waves * s
        chain = w.turns * s  # one trajectory's environment calls, in turn
        exposed = max(chain, serial - max(gen.wall_s - gen.prefill_s, 0.0)) if s > 0 else 0.0
        return {
            "core_seconds": runs * s,
            "waves": waves,
            "serial_s": serial,
            "exposed_s": exposed,
            "hidden_s": max(0.0, serial - exposed),
            "turns": w.turns,
        }
    waves = math.ceil(w.samples / w.pool_cores)
    serial = waves * s
    bulk_done = max(gen.bulk_end_s + s, gen.prefill_s + serial)
    last_done = gen.wall_s + s
    exposed = max(0.0, max(bulk_done, last_done) - gen.wall_s) if s > 0 else 0.0
    out = {
        "core_seconds": w.samples * s,
        "waves": waves,
        "serial_s": serial,
        "exposed_s": exposed,
        "hidden_s": max(0.0, serial - exposed),
        "turns": 1,
    }
    if w.fleet_nodes:
        out["fleet_nodes"], out["fleet_cpus_per_node"] = w.fleet_nodes, w.fleet_cpus_per_node
        out["fleet_nodes_to_keep_up"] = fleet_nodes_to_keep_up(w, gen)
    return out


def fleet_nodes_to_keep_up(w, gen: Generation) -> int:
    """The fewest fleet nodes whose waves fit between prefill's end and generation's end plus one s (the
    model above: a pool that size finishes with the longest completion's own scoring, however many
    more cores it had)."""
    s = w.seconds_per_sample
    if s <= 0:
        return 0
    waves_that_fit = max(1, math.floor((gen.wall_s - gen.prefill_s) / s) + 1)
    return math.ceil(math.ceil(w.samples / waves_that_fit) / w.fleet_cpus_per_node)
