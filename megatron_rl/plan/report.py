"""Assemble the plan of a recipe into a PlanReport (typed sections: report_types.py).

The text report and the plot read its fields; `--json` prints `PlanReport.to_json()`, whose nested
keys are the contract `--json` keeps: weights_bytes, kv_bytes_per_token, tokens.*, flops.*,
gpu_seconds.*, seconds.*, publication.*, memory_gib.*, meets_target (see REQUIRED_KEYS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from megatron_rl.parallel.layout import RECOMPUTE_MODES, ParallelLayout
from megatron_rl.plan import generation as gen_mod
from megatron_rl.plan import memory as mem_mod
from megatron_rl.plan import reliability as rel_mod
from megatron_rl.plan.alltoall import step_alltoall
from megatron_rl.plan.cost import cost
from megatron_rl.plan.cycle import Cycle, cycle
from megatron_rl.plan.flops import (
    critic_flops,
    logprob_forward_flops,
    model_flops,
    prefill_flops,
    recompute_extra_flops,
    reward_model_flops,
    tokens_per_step,
    train_flops,
)
from megatron_rl.plan.inputs import GIB, HOST_LINK_BYTES_PER_S, PlanInputs
from megatron_rl.plan.memory import by_model_gib, trainer_memory
from megatron_rl.plan.models import critic_recompute, side_models
from megatron_rl.plan.report_types import (
    AllToAll,
    AllToAllPhase,
    Assumptions,
    CalibrationSummary,
    Checkpoint,
    ClusterSummary,
    CycleRow,
    Dominant,
    EngineMemory,
    Flops,
    GpuSeconds,
    MemoryReport,
    ModelMemory,
    ModelSummary,
    PerSampleTokens,
    PlanReport,
    Publication,
    PublicationCut,
    PublicationSchemes,
    Rejection,
    Reliability,
    Scoring,
    SearchSummary,
    Seconds,
    SideModel,
    Target,
    Tokens,
    TrainerMemory,
    Units,
    from_dict,
)
from megatron_rl.plan.search import compare_splits, search
from megatron_rl.plan.wording import a, count, noun, num

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
    """Bytes to GiB for the float parts; counts (ints), names and reasons pass through."""
    return {k: (v / GIB if isinstance(v, float) else v) for k, v in d.items()}


def _overlap_option(own: Cycle, splits: list[Cycle]) -> Cycle | None:
    """The overlapped steady state: the recipe's own pools run one step asynchronous when it is separated
    (the same phases, pipelined: what `layout.synchrony=async` would give), else the best split."""
    if own.layout.overlapped:
        return own
    if not own.layout.colocated:
        return own.pipelined()
    options = [c for c in splits if c.layout.overlapped and c.fits]
    return min(options, key=lambda c: c.step_s) if options else None


def _dominant(inp: PlanInputs, c: Cycle, gpu_s: GpuSeconds, step: Cycle) -> Dominant:
    """Which phase is bigger in GPU-seconds of work (predicted) and in wall time (measured when calibrated).

    Wall time counts every phase a step waits on, the reward pool's exposed scoring included: on a small
    model it is most of the step, and more GPUs do not shorten it."""
    work = {
        "generation": gpu_s.generation,
        "train": gpu_s.train + gpu_s.train_recompute_extra,
        "logprob_forwards": gpu_s.logprob_forwards,
    }
    if inp.critic is not None:
        work["critic"] = gpu_s.critic
    if inp.reward_model is not None:
        work["reward_model"] = gpu_s.reward_model
    ph = step.phases
    wall = {
        "generation": ph.get("generation", 0.0),
        "scoring": ph.get("scoring", 0.0),  # the wait for rewards after generation ends
        "train": ph.get("train_fwd_bwd", 0.0) + ph.get("optimizer", 0.0),
        "logprob_forwards": ph.get("old_logprobs", 0.0) + ph.get("ref_logprobs", 0.0),
    }
    by_work = max(work, key=work.__getitem__)
    by_wall = max(wall, key=wall.__getitem__)
    g, w = c.gen, inp.work
    idle = 1.0 - g.gpu_seconds / g.gpu_seconds_held if g.gpu_seconds_held else 0.0
    ranked = sorted(work, key=work.__getitem__, reverse=True)
    ratio = work[ranked[0]] / work[ranked[1]] if work[ranked[1]] else float("inf")
    parts = [
        f"In GPU-seconds of work {ranked[0]} leads ({num(work[ranked[0]], 0)} vs {ranked[1]} "
        f"{num(work[ranked[1]], 0)}, x{ratio:.2f}); in wall time {by_wall} leads (generation "
        f"{num(wall['generation'])} s, scoring (exposed) {num(wall['scoring'])} s, training "
        f"{num(wall['train'])} s, log-prob forwards {num(wall['logprob_forwards'])} s)."
    ]
    side = [
        f"{label} {num(ph[name])} s"
        for name, label in (
            ("reward_model", "the reward model's forward"),
            ("critic_values", "the critic's old values"),
            ("critic_train", "the critic's training"),
        )
        if name in ph
    ]
    if side:
        parts.append(f"Beside the policy the trainer GPUs also run {', '.join(side)} per step.")
    if by_wall == "scoring":
        parts.append(
            f"Scoring is the CPU pool's: {count(w.samples, 'sample')} x {w.seconds_per_sample:g} core-s over "
            f"{count(w.pool_cores, 'core')}, of which {num(wall['scoring'])} s wait after generation ends; "
            + (
                f"the reward fleet ({count(w.fleet_nodes, 'node')}) is the bottleneck: more fleet nodes "
                "(reward.fleet_nodes) or cheaper tests shorten it, more GPUs do not."
                if w.fleet_nodes
                else "more reward cores (reward.pool_cores) or cheaper tests shorten it, more GPUs do not."
            )
        )
    if g.tail_s > 0.2 * g.decode_s:
        per_token = g.longest_completion_floor_s / w.max_new_tokens * 1e3
        parts.append(
            f"Generation's work is {num(g.gpu_seconds, 0)} GPU-s (prefill {num(g.prefill_s)} s + bulk decode "
            f"{num(g.bulk_decode_s)} s on {g.engines} x TP{g.engine_tp} {noun(g.engines, 'engine')}, bound by "
            f"{'compute' if g.compute_bound else 'HBM bandwidth'}), but its wall time is held by the longest "
            f"completion: {count(w.max_new_tokens, 'token')}, one per decode step at {per_token:.2f} ms however "
            f"empty the batch, {a(num(g.longest_completion_floor_s))} s floor that more engines do not shorten "
            f"(a wider engine TP does). Generation holds its GPUs {num(g.wall_s)} s and {idle:.0%} of those "
            "GPU-seconds wait on that tail."
        )
    else:
        parts.append(
            f"Generation keeps its batches full ({count(g.bulk_decode_steps, 'bulk decode step')} against "
            f"{a(f'{w.max_new_tokens:,}-token cap')}), so its wall time is its "
            f"{'compute' if g.compute_bound else 'bandwidth'} work spread over {count(g.engines, 'engine')}."
        )
    parts.append(
        f"Training is compute-bound: {num(work['train'], 0)} GPU-s at {inp.assume.train_mfu:.0%} MFU over "
        f"{count(c.layout.trainer_gpus, 'trainer GPU')}, so its wall time falls with every GPU added."
    )
    return Dominant(gpu_seconds=by_work, wall=by_wall, work_gpu_s=work, wall_s=wall, why=" ".join(parts))


def _assumptions(
    inp: PlanInputs, layout: ParallelLayout, restart_s: float, restart_source: str
) -> Assumptions:
    a, where = inp.assume, "cpu" if inp.hw.is_cpu else "gpu"
    return Assumptions(
        train_mfu=a.train_mfu,
        generation_bw_fraction=a.generation_bw_fraction,
        prefix_sharing=a.prefix_sharing,
        trainer_runtime_gib=mem_mod.TRAINER_RUNTIME_GIB[where],
        engine_runtime_gib=mem_mod.ENGINE_RUNTIME_GIB[where],
        decode_allreduce_latency_s=gen_mod.DECODE_ALLREDUCE_LATENCY_S,
        max_num_seqs=gen_mod.max_num_seqs(inp, layout.engine_tp),
        host_link_gbps=HOST_LINK_BYTES_PER_S / 1e9,
        restart_s=restart_s,
        restart_source=restart_source,
    )


def _model(inp: PlanInputs) -> ModelSummary:
    s = inp.spec
    return ModelSummary(
        name=s.name,
        params=inp.params,
        matmul_params=inp.matmul_params,
        dtype=s.params_dtype,
        layers=s.num_layers,
        hidden=s.hidden_size,
        kv_heads=s.num_query_groups,
        head_dim=s.head_dim,
        active_params=inp.active_params if s.is_moe else None,
        experts=s.num_experts if s.is_moe else None,
        experts_per_token=s.moe_topk if s.is_moe else None,
        expert_gemm=inp.assume.expert_gemm if s.is_moe else None,
        **{role: from_dict(SideModel, side) for role, side in side_models(inp).items()},
        assumed=tuple(inp.assumed) or None,
    )


def _alltoall(inp: PlanInputs, layout: ParallelLayout) -> AllToAll | None:
    """A mixture of experts' all-to-all per step (also at EP 1, where it is zero); None when dense."""
    if not inp.spec.is_moe:
        return None
    a = step_alltoall(inp, layout)
    phases = {k: from_dict(AllToAllPhase, v) for k, v in a.pop("phases").items()}
    return from_dict(AllToAll, a, phases=phases)


def _cluster(inp: PlanInputs) -> ClusterSummary:
    hw = inp.hw
    return ClusterSummary(
        nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node,
        gpus=hw.gpus,
        gpu_memory_gib=hw.gpu_memory_bytes / GIB,
        hbm_gbps=hw.hbm_bytes_per_s / 1e9,
        peak_tflops=hw.peak_flops / 1e12,
        nvlink_gbps=hw.nvlink_bytes_per_s / 1e9,
        node_ib_gbps=hw.node_ib_bytes_per_s / 1e9,
        storage_gbps=hw.storage_bytes_per_s / 1e9,
        node_mtbf_days=hw.node_mtbf_s / 86400,
    )


def _tokens(inp: PlanInputs) -> Tokens:
    t = tokens_per_step(inp)
    return from_dict(Tokens, t, per_sample=from_dict(PerSampleTokens, t["per_sample"]))


def _flops(inp: PlanInputs, layout: ParallelLayout, own: Cycle) -> Flops:
    lp = logprob_forward_flops(inp)
    critic_rec = critic_recompute(inp, layout.recompute)
    cf = critic_flops(inp, critic_rec)
    return Flops(
        train=train_flops(inp),
        train_recompute_extra=recompute_extra_flops(inp, layout.recompute),
        logprob_forwards=lp["total"],
        old_logprobs=lp["old"],
        ref_logprobs=lp["ref"],
        prefill_shared=own.gen.prefill_flops_shared,
        prefill_unshared=own.gen.prefill_flops_unshared,
        epochs=inp.work.epochs,
        critic_values=cf["values"],
        critic_train=cf["train"],
        critic_recompute_extra=cf["recompute_extra"],
        reward_model=reward_model_flops(inp),
        by_model=model_flops(inp, layout.recompute, critic_rec),
    )


def _gpu_seconds(inp: PlanInputs, layout: ParallelLayout, own: Cycle, step: Cycle) -> GpuSeconds:
    """Work at the assumed MFU; `step_held` is every GPU of the layout for the step that runs."""
    rate = inp.hw.peak_flops * inp.assume.train_mfu
    g = own.gen
    train = train_flops(inp) / rate
    extra = recompute_extra_flops(inp, layout.recompute) / rate
    logprob = logprob_forward_flops(inp)["total"] / rate
    critic = critic_flops(inp, critic_recompute(inp, layout.recompute))["total"] / rate
    rm = reward_model_flops(inp) / rate
    work = train + extra + logprob + g.gpu_seconds
    if inp.critic is not None or inp.reward_model is not None:
        work += critic + rm
    return GpuSeconds(
        train=train,
        train_recompute_extra=extra,
        logprob_forwards=logprob,
        generation=g.gpu_seconds,
        generation_held=g.gpu_seconds_held,
        prefill=prefill_flops(inp, inp.assume.prefix_sharing) / rate,
        step_held=layout.gpus * step.step_s,
        step_work=work,
        critic=critic,
        reward_model=rm,
    )


def _seconds(own: Cycle, scoring: Scoring, step: Cycle, overlap: Cycle | None) -> Seconds:
    exposed = step.phases.get("scoring", 0.0)
    return Seconds(
        longest_completion_floor=own.gen.longest_completion_floor_s,
        scoring=scoring.serial_s,
        scoring_exposed=exposed,
        scoring_hidden=max(0.0, scoring.serial_s - exposed),
        serial_cycle=step.serial_s,
        overlapped_cycle=overlap.overlapped_s if overlap is not None else None,
        collection_path=overlap.collection_s if overlap is not None else None,
        learning_path=overlap.learning_s if overlap is not None else None,
        step=step.step_s,
        phases={k: v for k, v in step.phases.items() if k != "scoring"},
    )


def _publication(pub: Mapping[str, Any]) -> Publication:
    return from_dict(
        Publication,
        pub,
        cuts=tuple(from_dict(PublicationCut, c) for c in pub["cuts"]),
        schemes=from_dict(PublicationSchemes, pub["schemes"]),
    )


def _memory(inp: PlanInputs, layout: ParallelLayout, fit: Mapping[str, Any]) -> MemoryReport:
    engine = {k: v for k, v in fit["engine"].items() if k != "kv_bytes_per_token_per_gpu"}
    trainer = {k: v for k, v in fit["trainer"].items() if k != "by_model"}
    return MemoryReport(
        trainer_per_gpu=fit["trainer"]["total"] / GIB,
        engine_per_gpu=fit["engine"]["total"] / GIB,
        peak_per_gpu=fit["peak"] / GIB,
        gpu_memory=inp.hw.gpu_memory_bytes / GIB,
        trainer=from_dict(TrainerMemory, _gib(trainer)),
        engine=from_dict(EngineMemory, _gib(engine)),
        activations_by_recompute={
            m: trainer_memory(inp, layout, m)["activations"] / GIB for m in RECOMPUTE_MODES
        },
        fits=fit["fits"],
        reasons=tuple(fit["reasons"]),
        by_model={role: from_dict(ModelMemory, m) for role, m in by_model_gib(fit["by_model"]).items()},
        moments={k: v / GIB for k, v in fit["moments"].items()},
    )


def _target(
    inp: PlanInputs, layout: ParallelLayout, step_s: float, rel: Reliability, restart_s: float
) -> Target:
    """The predicted run against the target hours; what Young/Daly saves would give if none are made."""
    hours = rel.total_s / 3600
    young_daly = None
    if rel.interval_source == "never":
        yd = dataclasses.replace(inp, assume=dataclasses.replace(inp.assume, checkpoint_interval_steps=-1))
        young_daly = rel_mod.reliability(yd, layout, step_s, restart_fixed_s=restart_s)["total_s"] / 3600
    return Target(
        steps=inp.work.steps,
        hours=inp.assume.target_hours,
        predicted_hours=hours,
        margin_hours=inp.assume.target_hours - hours,
        steps_in_target=steps_in_target(inp, layout, step_s, restart_s),
        predicted_hours_with_young_daly=young_daly,
    )


def _calibration(cal: Mapping[str, Any]) -> CalibrationSummary:
    return CalibrationSummary(
        steps=cal["steps"],
        measured_s=cal["measured_s"],
        predicted_s=cal["predicted_s"],
        factors=cal["factors"],
        offsets=cal["offsets"],
        init_s=cal["init_s"],
        mem_gib_max=cal["mem_gib_max"],
    )


def _search(inp: PlanInputs, top: int) -> SearchSummary:
    res = search(inp)
    return SearchSummary(
        gpus=res["gpus"],
        evaluated=res["candidates"],
        ranked=tuple(CycleRow.of(c) for c in res["ranked"][:top]),
        accepted=len(res["ranked"]),
        rejected_by_kind=res["rejected_by_kind"],
        rejected_examples=tuple(from_dict(Rejection, r) for r in _examples(res["rejected"])),
    )


def build_report(
    inp: PlanInputs,
    layout: ParallelLayout,
    calibration: dict | None = None,
    with_search: bool = True,
    top: int = 10,
    recovery: tuple[float, str] | None = None,
) -> PlanReport:
    """Everything the planner knows about a recipe on its layout; `calibration` from calibrate().

    Calibrated, the step that runs (its phases, cycle, reliability and target) is the measured one,
    and the splits table and the overlapped option are the calibrated what-ifs. `recovery`: the restart
    (seconds, description) from reliability.restart_from_recovery, else the run's measured init or the
    assumed RESTART_FIXED_S.
    """
    own = cycle(inp, layout)
    splits = compare_splits(inp, layout)
    step = own if calibration is None else calibration["cycle"]
    rows = splits if calibration is None else calibration["what_if"]
    overlap = _overlap_option(step, rows)  # from the calibrated what-ifs when measured
    restart, restart_source = rel_mod.RESTART_FIXED_S, "assumed"
    if recovery is not None:  # benchmarks/recovery.py's measured parts
        restart, restart_source = recovery
    elif calibration is not None and calibration["init_s"] is not None:
        restart, restart_source = calibration["init_s"], "the run's measured init phase"
    rel_d = rel_mod.reliability(inp, layout, step.step_s, restart_fixed_s=restart)
    rel = from_dict(Reliability, rel_d, checkpoint=from_dict(Checkpoint, rel_d["checkpoint"]))
    target = _target(inp, layout, step.step_s, rel, restart)
    gpu_s = _gpu_seconds(inp, layout, own, step)
    scoring = from_dict(Scoring, own.scoring)
    return PlanReport(
        recipe=inp.name,
        units=Units(),
        assumptions=_assumptions(inp, layout, restart, restart_source),
        model=_model(inp),
        cluster=_cluster(inp),
        layout=CycleRow.of(own),
        weights_bytes=inp.weights_bytes,
        kv_bytes_per_token=inp.kv_bytes_per_token,
        tokens=_tokens(inp),
        flops=_flops(inp, layout, own),
        gpu_seconds=gpu_s,
        generation=own.gen,
        scoring=scoring,
        seconds=_seconds(own, scoring, step, overlap),
        phases_s=dict(step.phases),
        overlap=CycleRow.of(overlap) if overlap is not None else None,
        splits=tuple(CycleRow.of(c) for c in rows),
        publication=_publication(own.publication),
        memory_gib=_memory(inp, layout, own.memory),
        reliability=rel,
        target=target,
        cost=cost(inp, layout, step.step_s, restart),
        meets_target=target.predicted_hours <= inp.assume.target_hours and own.memory["fits"],
        dominant=_dominant(inp, own, gpu_s, step),
        calibrated=calibration is not None,
        calibration=_calibration(calibration) if calibration is not None else None,
        search=_search(inp, top) if with_search else None,
        alltoall=_alltoall(inp, layout),
    )


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
    """The first few rejections of each kind: enough to see why, not the whole list."""
    seen: dict[str, int] = {}
    out = []
    for r in rejected:
        if seen.get(r["kind"], 0) < per_kind:
            seen[r["kind"]] = seen.get(r["kind"], 0) + 1
            out.append(r)
    return out


def lookup(report: Mapping[str, Any], dotted: str) -> Any:
    """`report["a"]["b"]` for "a.b" in the `--json` dict (PlanReport.to_json()); KeyError naming the part."""
    node = report
    for part in dotted.split("."):
        node = node[part]
    return node
