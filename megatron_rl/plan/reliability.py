"""Checkpoints and failures: how often to save, and what the expected failures cost.

A checkpoint holds the trainer's params (parameter dtype) and its optimizer state (fp32 master
copy and Adam m, v: 12 B/param; 8 B for fp32 params) for megatron's padded vocabulary; gradients
and engine weights are not saved. Writing it is bound by the shared storage: bytes / storage_gbps.

Young/Daly: with a job MTBF of M (node MTBF / nodes) and a checkpoint that costs delta seconds of
progress, the interval that minimises expected lost time is tau = sqrt(2·delta·M) - delta (Daly's
first-order form of Young's sqrt(2·delta·M)). A synchronous save costs its whole write; an async save
costs only the copy of each GPU's shard to host memory, but a save cannot start before the previous
one is on storage, so tau is never shorter than the write. Each failure loses on average half an
interval, plus the write in flight, plus a restart (requeue, start-up, reading the checkpoint back).
checkpoint.interval: N > 0 saves every N steps, -1 every Young/Daly interval, 0 never (then each
failure restarts the run from step 0, and the report says so).
"""

from __future__ import annotations

import math

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import PlanInputs
from megatron_rl.plan.memory import optimizer_bytes_per_param

# Requeue, process start, NCCL and engine initialisation after a failure (assumed; --from-steps
# replaces it with the measured `init` phase). Reading the checkpoint back is added on top.
RESTART_FIXED_S = 300.0


# The parts of a restart benchmarks/recovery.py measures that the planner takes (the checkpoint read is
# modelled from the recipe's bytes, the lost work from its interval: the tiny run's do not scale).
RECOVERY_PARTS = ("detection_s", "requeue_s", "startup_s")


def restart_from_recovery(measured: dict, source: str) -> tuple[float, str]:
    """The restart (seconds) and its description from benchmarks/recovery.py's JSON; a part that is
    missing or not a finite number >= 0 is refused by name (a restart that cannot be read is not 0)."""
    parts = {}
    for key in RECOVERY_PARTS:
        v = measured.get(key) if isinstance(measured, dict) else None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(
                f"{source}: {key}={v!r} is not a measured number of seconds; rerun benchmarks/recovery.py "
                f"(it writes {', '.join(RECOVERY_PARTS)})"
            )
        parts[key] = float(v)
    how = measured.get("requeue_source", "requeue")
    text = (
        f"measured ({source}): detection {parts['detection_s']:.1f} s + requeue {parts['requeue_s']:.1f} s "
        f"({how}) + start-up {parts['startup_s']:.1f} s"
    )
    return sum(parts.values()), text


def checkpoint(inp: PlanInputs, layout: ParallelLayout) -> dict:
    s = inp.spec
    params = s.num_params(s.padded_vocab(layout.tp))
    per_param = s.dtype_bytes + optimizer_bytes_per_param(s.params_dtype)
    nbytes = float(params * per_param)
    write_s = nbytes / inp.hw.storage_bytes_per_s
    stage_s = nbytes / layout.trainer_gpus / inp.hw.host_link_bytes_per_s
    return {
        "bytes": nbytes,
        "bytes_per_param": per_param,
        "write_s": write_s,
        "read_s": write_s,
        "blocking_s": stage_s if inp.assume.async_save else write_s,
        "async": inp.assume.async_save,
    }


def young_daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Checkpoint interval (s) minimising expected lost time; MTBF itself when saving costs >= MTBF/2."""
    if cost_s <= 0:
        return 0.0
    if cost_s >= mtbf_s / 2:
        return mtbf_s
    return math.sqrt(2.0 * cost_s * mtbf_s) - cost_s


def reliability(
    inp: PlanInputs, layout: ParallelLayout, step_s: float, restart_fixed_s: float = RESTART_FIXED_S
) -> dict:
    """Expected failures, the checkpoint interval, the time they cost, and the predicted run length."""
    ck = checkpoint(inp, layout)
    steps = inp.work.steps
    nodes = math.ceil(layout.gpus / inp.hw.gpus_per_node)
    job_mtbf = inp.hw.node_mtbf_s / nodes
    run_s = steps * step_s
    failures = run_s / job_mtbf
    tau = max(young_daly_interval(ck["blocking_s"], job_mtbf), ck["write_s"])
    optimal_steps = max(1, round(tau / step_s)) if step_s > 0 else 1
    configured = inp.assume.checkpoint_interval_steps
    if configured > 0:
        interval_steps, source = configured, "recipe"
    elif configured == -1:
        interval_steps, source = optimal_steps, "young_daly"
    else:
        interval_steps, source = 0, "never"
    if interval_steps:
        saves = steps // interval_steps
        save_overhead = saves * ck["blocking_s"]
        restart_s = restart_fixed_s + ck["read_s"]
        lost_per_failure = interval_steps * step_s / 2 + (ck["write_s"] if ck["async"] else 0.0) + restart_s
        expected_lost = failures * lost_per_failure
    else:
        # No checkpoint: every failure restarts from step 0. With failures at rate 1/M, finishing
        # T seconds of work takes (M + restart)(e^(T/M) - 1) on average (first order would be
        # meaningless here: the loss grows exponentially with the run).
        saves, save_overhead, restart_s = 0, 0.0, restart_fixed_s
        expected_lost = (job_mtbf + restart_s) * math.expm1(run_s / job_mtbf) - run_s
        lost_per_failure = expected_lost / failures if failures else 0.0
    return {
        "checkpoint": ck,
        "nodes": nodes,
        "job_mtbf_s": job_mtbf,
        "expected_failures": failures,
        "young_daly_interval_s": tau,
        "young_daly_interval_if_sync_s": young_daly_interval(ck["write_s"], job_mtbf),
        "interval_steps": interval_steps,
        "interval_steps_optimal": optimal_steps,
        "interval_source": source,
        "saves": saves,
        "save_overhead_s": save_overhead,
        "restart_s": restart_s,
        "lost_per_failure_s": lost_per_failure,
        "expected_lost_s": expected_lost,
        "startup_s": restart_fixed_s,
        "total_s": restart_fixed_s + run_s + save_overhead + expected_lost,
    }
