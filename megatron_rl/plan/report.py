"""Assemble the plan of a recipe into one JSON-ready dict (the text report and the plot read it).

Nested keys are the contract `--json` keeps: weights_bytes, kv_bytes_per_token, tokens.*, flops.*,
gpu_seconds.*, seconds.*, publication.*, memory_gib.*, meets_target (see REQUIRED_KEYS).
"""

from __future__ import annotations

import dataclasses

from megatron_rl.layout import RECOMPUTE_MODES, ParallelLayout
from megatron_rl.plan import generation as gen_mod
from megatron_rl.plan import memory as mem_mod
from megatron_rl.plan import reliability as rel_mod
from megatron_rl.plan.cycle import Cycle, compare_splits, cycle
from megatron_rl.plan.flops import (
    logprob_forward_flops,
    prefill_flops,
    recompute_extra_flops,
    tokens_per_step,
    train_flops,
)
from megatron_rl.plan.inputs import GIB, HOST_LINK_BYTES_PER_S, PlanInputs
from megatron_rl.plan.memory import trainer_memory
from megatron_rl.plan.search import search

REQUIRED_KEYS = (
    "weights_bytes",
    "kv_bytes_per_token",
    "tokens.prompt",
    "tokens.completion",
    "tokens.trained",
    "flops.train",
    "flops.logprob_forwards",
    "gpu_seconds.train",
    "gpu_seconds.logprob_forwards",
    "gpu_seconds.generation",
    "seconds.longest_completion_floor",
    "seconds.scoring",
    "seconds.serial_cycle",
    "seconds.overlapped_cycle",
    "publication.bytes",
    "publication.floor_s",
    "memory_gib.trainer_per_gpu",
    "memory_gib.engine_per_gpu",
    "meets_target",
)


def _gib(d: dict) -> dict:
    return {k: (v / GIB if isinstance(v, float) else v) for k, v in d.items()}


def cycle_row(c: Cycle) -> dict:
    lay = c.layout
    return {
        "layout": lay.describe(),
        "placement": lay.placement,
        "synchrony": lay.synchrony,
        "tp": lay.tp,
        "pp": lay.pp,
        "dp": lay.dp,
        "engine_tp": lay.engine_tp,
        "engine_count": lay.engine_count,
        "recompute": lay.recompute,
        "engine_gpus": lay.engine_gpus,
        "trainer_gpus": lay.trainer_gpus,
        "gpus": lay.gpus,
        "phases_s": dict(c.phases),
        "serial_s": c.serial_s,
        "collection_s": c.collection_s,
        "learning_s": c.learning_s,
        "overlapped_s": c.overlapped_s,
        "step_s": c.step_s,
        "gpu_seconds": c.gpu_seconds,
        "peak_gib": c.memory["peak"] / GIB,
        "fits": c.fits,
        "reasons": c.reasons,
    }


def _overlap_option(own: Cycle, splits: list[Cycle]) -> Cycle | None:
    """The overlapped steady state: the recipe's own if it is separated and async, else the best split."""
    if own.layout.overlapped:
        return own
    if not own.layout.colocated:
        return own  # same pools, pipelined: overlapped_s of the same phases
    options = [c for c in splits if c.layout.overlapped and c.fits]
    return min(options, key=lambda c: c.step_s) if options else None


def _dominant(inp: PlanInputs, c: Cycle, gpu_s: dict, step: Cycle) -> dict:
    """Which phase is bigger in GPU-seconds of work (predicted) and in wall time (measured when calibrated)."""
    work = {
        "generation": gpu_s["generation"],
        "train": gpu_s["train"] + gpu_s["train_recompute_extra"],
        "logprob_forwards": gpu_s["logprob_forwards"],
    }
    ph = step.phases
    wall = {
        "generation": ph.get("generation", 0.0),
        "train": ph.get("train_fwd_bwd", 0.0) + ph.get("optimizer", 0.0),
        "logprob_forwards": ph.get("old_logprobs", 0.0) + ph.get("ref_logprobs", 0.0),
    }
    by_work = max(work, key=work.get)
    by_wall = max(wall, key=wall.get)
    g = c.gen
    idle = 1.0 - g.gpu_seconds / g.gpu_seconds_held if g.gpu_seconds_held else 0.0
    ranked = sorted(work, key=work.get, reverse=True)
    ratio = work[ranked[0]] / work[ranked[1]] if work[ranked[1]] else float("inf")
    parts = [
        f"In GPU-seconds of work {ranked[0]} leads ({work[ranked[0]]:,.0f} vs {ranked[1]} "
        f"{work[ranked[1]]:,.0f}, x{ratio:.2f}); in wall time {by_wall} leads (generation "
        f"{wall['generation']:.1f} s, training {wall['train']:.1f} s, log-prob forwards "
        f"{wall['logprob_forwards']:.1f} s)."
    ]
    if g.tail_s > 0.2 * g.decode_s:
        per_token = g.longest_completion_floor_s / inp.work.max_new_tokens * 1e3
        parts.append(
            f"Generation's work is {g.gpu_seconds:,.0f} GPU-s (prefill {g.prefill_s:.1f} s + bulk decode "
            f"{g.bulk_decode_s:.1f} s on {g.engines} x TP{g.engine_tp} engines, bound by HBM bandwidth), but "
            f"its wall time is held by the longest completion: {inp.work.max_new_tokens:,} tokens, one per "
            f"decode step at {per_token:.2f} ms however empty the batch, a {g.longest_completion_floor_s:.1f} s "
            f"floor that more engines do not shorten (a wider engine TP does). Generation holds its GPUs "
            f"{g.wall_s:.1f} s and {idle:.0%} of those GPU-seconds wait on that tail."
        )
    else:
        parts.append(
            f"Generation keeps its batches full ({g.bulk_decode_steps:,} bulk decode steps against a "
            f"{inp.work.max_new_tokens:,}-token cap), so its wall time is its "
            f"{'compute' if g.compute_bound else 'bandwidth'} work spread over {g.engines} engines."
        )
    parts.append(
        f"Training is compute-bound: {work['train']:,.0f} GPU-s at {inp.assume.train_mfu:.0%} MFU over "
        f"{c.layout.trainer_gpus} trainer GPUs, so its wall time falls with every GPU added."
    )
    why = " ".join(parts)
    return {"gpu_seconds": by_work, "wall": by_wall, "work_gpu_s": work, "wall_s": wall, "why": why}


def build_report(
    inp: PlanInputs, layout: ParallelLayout, calibration=None, with_search: bool = True, top: int = 10
) -> dict:
    """Everything the planner knows about a recipe on its layout; `calibration` from calibrate()."""
    w, hw, a, s = inp.work, inp.hw, inp.assume, inp.spec
    own = cycle(inp, layout)
    splits = compare_splits(inp, layout)
    rate = hw.peak_flops * a.train_mfu
    lp = logprob_forward_flops(inp)
    tflops = train_flops(inp)
    g = own.gen
    gpu_s = {
        "train": tflops / rate,
        "train_recompute_extra": recompute_extra_flops(inp, layout.recompute) / rate,
        "logprob_forwards": lp["total"] / rate,
        "generation": g.gpu_seconds,
        "generation_held": g.gpu_seconds_held,
        "prefill": prefill_flops(inp, a.prefix_sharing) / rate,
    }
    step = own
    if calibration is not None:
        step = calibration["cycle"]
    overlap = _overlap_option(own, splits)
    if calibration is not None and own.layout.colocated and calibration["best_separated"] is not None:
        overlap = calibration["best_separated"]
    seconds = {
        "longest_completion_floor": g.longest_completion_floor_s,
        "scoring": own.scoring["serial_s"],
        "scoring_exposed": step.phases.get("scoring", 0.0),
        "scoring_hidden": max(0.0, own.scoring["serial_s"] - step.phases.get("scoring", 0.0)),
        "serial_cycle": step.serial_s,
        "overlapped_cycle": overlap.overlapped_s if overlap else None,
        "collection_path": overlap.collection_s if overlap else None,
        "learning_path": overlap.learning_s if overlap else None,
        "step": step.step_s,
    }
    seconds.update({k: v for k, v in step.phases.items() if k not in ("scoring",)})
    gpu_s["step_held"] = layout.gpus * step.step_s
    gpu_s["step_work"] = (
        gpu_s["train"] + gpu_s["train_recompute_extra"] + gpu_s["logprob_forwards"] + g.gpu_seconds
    )
    restart = rel_mod.RESTART_FIXED_S
    if calibration is not None and calibration["init_s"] is not None:
        restart = calibration["init_s"]
    rel = rel_mod.reliability(inp, layout, step.step_s, restart_fixed_s=restart)
    hours = rel["total_s"] / 3600
    young_daly = None
    if rel["interval_source"] == "never":
        yd = dataclasses.replace(inp, assume=dataclasses.replace(a, checkpoint_interval_steps=-1))
        young_daly = rel_mod.reliability(yd, layout, step.step_s, restart_fixed_s=restart)["total_s"] / 3600
    fit = own.memory
    mem = {
        "trainer_per_gpu": fit["trainer"]["total"] / GIB,
        "engine_per_gpu": fit["engine"]["total"] / GIB,
        "peak_per_gpu": fit["peak"] / GIB,
        "gpu_memory": hw.gpu_memory_bytes / GIB,
        "trainer": _gib(fit["trainer"]),
        "engine": _gib({k: v for k, v in fit["engine"].items() if k != "kv_bytes_per_token_per_gpu"}),
        "activations_by_recompute": {
            m: trainer_memory(inp, layout, m)["activations"] / GIB for m in RECOMPUTE_MODES
        },
        "fits": fit["fits"],
        "reasons": fit["reasons"],
    }
    report = {
        "recipe": inp.name,
        "units": {
            "bytes_moved": "decimal GB = 1e9 B; rates GB/s",
            "memory_held": "GiB = 2^30 B",
            "links": "InfiniBand Gb/s divided by 8 -> GB/s",
            "flops": "FLOP (PFLOP = 1e15 in the text)",
            "time": "seconds",
        },
        "assumptions": {
            "train_mfu": a.train_mfu,
            "generation_bw_fraction": a.generation_bw_fraction,
            "prefix_sharing": a.prefix_sharing,
            "trainer_runtime_gib": mem_mod.TRAINER_RUNTIME_GIB["cpu" if hw.is_cpu else "gpu"],
            "engine_runtime_gib": mem_mod.ENGINE_RUNTIME_GIB["cpu" if hw.is_cpu else "gpu"],
            "decode_allreduce_latency_s": gen_mod.DECODE_ALLREDUCE_LATENCY_S,
            "max_num_seqs": gen_mod.max_num_seqs(inp, layout.engine_tp),
            "host_link_gbps": HOST_LINK_BYTES_PER_S / 1e9,
            "restart_s": restart,
            "completion_lengths": "mean for the bulk; the longest completion reaches the cap",
        },
        "model": {
            "name": s.name,
            "params": inp.params,
            "matmul_params": inp.matmul_params,
            "dtype": s.params_dtype,
            "layers": s.num_layers,
            "hidden": s.hidden_size,
            "kv_heads": s.num_query_groups,
            "head_dim": s.head_dim,
        },
        "cluster": {
            "nodes": hw.nodes,
            "gpus_per_node": hw.gpus_per_node,
            "gpus": hw.gpus,
            "gpu_memory_gib": hw.gpu_memory_bytes / GIB,
            "hbm_gbps": hw.hbm_bytes_per_s / 1e9,
            "peak_tflops": hw.peak_flops / 1e12,
            "nvlink_gbps": hw.nvlink_bytes_per_s / 1e9,
            "node_ib_gbps": hw.node_ib_bytes_per_s / 1e9,
            "storage_gbps": hw.storage_bytes_per_s / 1e9,
            "node_mtbf_days": hw.node_mtbf_s / 86400,
        },
        "layout": cycle_row(own) | {"describe": layout.describe()},
        "weights_bytes": inp.weights_bytes,
        "kv_bytes_per_token": inp.kv_bytes_per_token,
        "tokens": tokens_per_step(inp),
        "flops": {
            "train": tflops,
            "train_recompute_extra": recompute_extra_flops(inp, layout.recompute),
            "logprob_forwards": lp["total"],
            "old_logprobs": lp["old"],
            "ref_logprobs": lp["ref"],
            "prefill_shared": g.prefill_flops_shared,
            "prefill_unshared": g.prefill_flops_unshared,
        },
        "gpu_seconds": gpu_s,
        "generation": g.as_dict(),
        "scoring": own.scoring,
        "seconds": seconds,
        "phases_s": dict(step.phases),
        "overlap": cycle_row(overlap) if overlap else None,
        "splits": [cycle_row(c) for c in (calibration["what_if"] if calibration is not None else splits)],
        "publication": own.publication,
        "memory_gib": mem,
        "reliability": rel,
        "target": {
            "steps": w.steps,
            "hours": a.target_hours,
            "predicted_hours": hours,
            "margin_hours": a.target_hours - hours,
            "steps_in_target": steps_in_target(inp, layout, step.step_s, restart),
            "predicted_hours_with_young_daly": young_daly,
        },
        "meets_target": hours <= a.target_hours and fit["fits"],
        "dominant": _dominant(inp, own, gpu_s, step),
        "calibrated": calibration is not None,
    }
    if calibration is not None:
        report["calibration"] = {
            "steps": calibration["steps"],
            "measured_s": calibration["measured_s"],
            "predicted_s": calibration["predicted_s"],
            "factors": calibration["factors"],
            "offsets": calibration["offsets"],
            "init_s": calibration["init_s"],
            "mem_gib_max": calibration["mem_gib_max"],
        }
    if with_search:
        res = search(inp)
        report["search"] = {
            "gpus": res["gpus"],
            "evaluated": res["candidates"],
            "ranked": [cycle_row(c) for c in res["ranked"][:top]],
            "accepted": len(res["ranked"]),
            "rejected_by_kind": res["rejected_by_kind"],
            "rejected_examples": _examples(res["rejected"]),
        }
    return report


def steps_in_target(inp: PlanInputs, layout: ParallelLayout, step_s: float, restart_s: float) -> int:
    """The most steps whose predicted run (failures and saves included) fits in the target hours.

    Bisection: the predicted run grows with the step count, but not linearly once failures compound.
    """
    target_s = inp.assume.target_hours * 3600

    def total(n: int) -> float:
        trial = dataclasses.replace(inp, work=dataclasses.replace(inp.work, steps=n))
        return rel_mod.reliability(trial, layout, step_s, restart_fixed_s=restart_s)["total_s"]

    lo, hi = 0, max(1, int(target_s / step_s) + 1) if step_s > 0 else 1
    if total(hi) <= target_s:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= target_s else (lo, mid)
    return lo


def _examples(rejected: list[dict], per_kind: int = 2) -> list[dict]:
    seen: dict[str, int] = {}
    out = []
    for r in rejected:
        if seen.get(r["kind"], 0) < per_kind:
            seen[r["kind"]] = seen.get(r["kind"], 0) + 1
            out.append(r)
    return out


def lookup(report: dict, dotted: str):
    """`report["a"]["b"]` for "a.b"; KeyError naming the missing part."""
    node = report
    for part in dotted.split("."):
        node = node[part]
    return node
