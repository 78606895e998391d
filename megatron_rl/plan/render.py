"""The plan as text: every number with its unit, sections in the order a reader asks them.

One function per section, each reading the typed PlanReport (report_types.py) and returning its lines.
"""

from __future__ import annotations

from megatron_rl.plan.cost import render_cost
from megatron_rl.plan.report_types import PlanReport
from megatron_rl.plan.wording import count, every, noun
from megatron_rl.plan.wording import num as _f

PF = 1e15
GB = 1e9
GIB_B = 2**30  # bytes in a GiB: a model's params (GiB) per parameter back to bytes


def _count(n: float) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def _rows(rows: list[tuple], indent: str = "   ", left: int = 1) -> list[str]:
    """A table: the first `left` columns left-aligned, the rest (numbers) right-aligned."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [str(c).ljust(widths[i]) if i < left else str(c).rjust(widths[i]) for i, c in enumerate(r)]
        out.append(indent + "  ".join(cells).rstrip())
    return out


_EXPERT_GEMMS = {
    "grouped": "grouped expert GEMMs (transformer-engine)",
    "per_expert": "one GEMM per expert (no transformer-engine: charged per expert, plan/cycle.py)",
}


def _header(r: PlanReport) -> list[str]:
    m, c, a = r.model, r.cluster, r.assumptions
    b = r.kv_bytes_per_token
    moe = []
    if m.active_params is not None:
        moe = [
            f"         mixture of experts: {m.experts} experts per layer, top-{m.experts_per_token} per "
            f"token: {_count(m.params)} params in memory, {_count(m.active_params)} active per token "
            f"(the FLOPs); {_EXPERT_GEMMS.get(m.expert_gemm, m.expert_gemm)}"
        ]
    return [
        f"megatron-rl plan  {r.recipe}" + ("  (calibrated with measured steps)" if r.calibrated else ""),
        "Units: bytes that move in decimal GB (1e9 B) and GB/s; memory held in GiB (2^30 B); "
        "InfiniBand Gb/s / 8 = GB/s; compute in PFLOP (1e15 FLOP); time in seconds.",
        "",
        f"Model    {m.name}: {_count(m.params)} params ({_count(m.matmul_params)} in matmuls), "
        f"{m.dtype}: weights {_f(r.weights_bytes / GB, 2)} GB",
        *moe,
        f"         KV cache {b:,} B/token = 2 x {m.layers} layers x {m.kv_heads} KV heads x "
        f"{m.head_dim} x {b // (2 * m.layers * m.kv_heads * m.head_dim)} B",
        *_side_models(r),
        f"Cluster  {count(c.nodes, 'node')} x {c.gpus_per_node} = {count(c.gpus, 'GPU')}; {c.gpu_memory_gib:.0f} GiB, "
        f"HBM {_f(c.hbm_gbps, 0)} GB/s, {c.peak_tflops:,.4g} TFLOPS bf16 dense; NVLink "
        f"{_f(c.nvlink_gbps, 0)} GB/s; IB {_f(c.node_ib_gbps, 0)} GB/s per node; storage "
        f"{_f(c.storage_gbps, 0)} GB/s; node MTBF {c.node_mtbf_days:g} days",
        f"Layout   {r.layout.describe}" + (" (sync)" if r.layout.placement == "colocated" else ""),
        f"Assume   training at {a.train_mfu:.0%} of peak compute; generation at "
        f"{a.generation_bw_fraction:.0%} of peak HBM bandwidth; prefix sharing "
        f"{'on' if a.prefix_sharing else 'off'}; runtime {a.trainer_runtime_gib:g} GiB trainer / "
        f"{a.engine_runtime_gib:g} GiB engine per GPU; TP all-reduce {a.decode_allreduce_latency_s * 1e6:g} us; "
        f"host link {a.host_link_gbps:g} GB/s; restart {a.restart_s:.0f} s ({a.restart_source})",
    ]


_HEADS = {"value": "a one-output value head", "score": "a one-label score head"}


def _side_models(r: PlanReport) -> list[str]:
    """PPO's critic and a learned reward model, and which shapes were assumed (run.assumed)."""
    m = r.model
    out = []
    for label, side, what in (
        (
            "Critic  ",
            m.critic,
            "PPO's value model, trained on the trainer's GPUs (at critic.tp/pp, 0 = the trainer's)",
        ),
        ("Reward  ", m.reward_model, "a learned reward model, frozen, scored after generation"),
    ):
        if side is None:
            continue
        start = "the policy's weights" if side.source == "policy" else side.source
        out.append(
            f"{label} {what}: {side.layers} layers x {side.hidden} with {_HEADS.get(side.head, side.head)}, "
            f"{_count(side.params)} params ({_count(side.matmul_params)} in matmuls), from {start}"
            + (
                f"; SHAPE ASSUMED: {side.key}'s config.json is not readable here, the policy's shape is planned"
                if side.shape_assumed
                else ""
            )
        )
    return out


def _tokens(r: PlanReport) -> list[str]:
    t = r.tokens
    ps = t.per_sample
    return ["", f"1. Tokens per step: {count(t.sequences, 'sequence')}"] + _rows(
        [
            ("prompt", f"{ps.prompt:,} per sample", f"{t.prompt:,}", f"({t.prompt_unique:,} unique)"),
            ("completion", f"{ps.completion:,} mean, cap {ps.completion_cap:,}", f"{t.completion:,}", ""),
            ("trained", f"{ps.prompt + ps.completion:,} per sequence", f"{t.trained:,}", ""),
        ]
    )


def _compute(r: PlanReport) -> list[str]:
    fl, gs, a = r.flops, r.gpu_seconds, r.assumptions
    rate = r.cluster.peak_tflops * a.train_mfu
    rows = [
        ("policy training (6·P + attention)", f"{_f(fl.train / PF)} PFLOP", f"{_f(gs.train, 0)} GPU-s"),
        (
            "old-policy forward (2·P + attention)",
            f"{_f(fl.old_logprobs / PF)} PFLOP" if fl.old_logprobs else "none",
            "" if fl.old_logprobs else "algorithm.old_logprobs: the update's own forward or the engines'",
        ),
        ("reference forward (2·P + attention)", f"{_f(fl.ref_logprobs / PF)} PFLOP", ""),
        (
            "log-prob forwards together",
            f"{_f(fl.logprob_forwards / PF)} PFLOP",
            f"{_f(gs.logprob_forwards, 0)} GPU-s",
        ),
    ]
    if fl.train_recompute_extra:
        rows.append(
            (
                f"{r.layout.recompute} recompute (extra)",
                f"{_f(fl.train_recompute_extra / PF)} PFLOP",
                f"{_f(gs.train_recompute_extra, 0)} GPU-s",
            )
        )
    if fl.epochs > 1:
        rows[0] = (f"policy training (6·P + attention) x {fl.epochs} epochs", *rows[0][1:])
    rows += _side_compute(r)
    return ["", f"2. Compute (GPU-seconds at {a.train_mfu:.0%} MFU = {rate:,.4g} TFLOPS per GPU)"] + _rows(
        rows
    )


def _side_compute(r: PlanReport) -> list[tuple]:
    """The rows of PPO's critic and of a reward model: each at its own matmul parameters."""
    fl, gs, m = r.flops, r.gpu_seconds, r.model
    rows = []
    if m.reward_model is not None:
        rows.append(
            (
                "reward model forward (2·P_rm + attention)",
                f"{_f(fl.reward_model / PF)} PFLOP",
                f"{_f(gs.reward_model, 0)} GPU-s",
            )
        )
    if m.critic is not None:
        epochs = f" x {fl.epochs} epochs" if fl.epochs > 1 else ""
        rows += [
            ("critic old values (2·P_c + attention)", f"{_f(fl.critic_values / PF)} PFLOP", ""),
            (f"critic training (6·P_c + attention){epochs}", f"{_f(fl.critic_train / PF)} PFLOP", ""),
        ]
        if fl.critic_recompute_extra:
            rows.append(("critic recompute (extra)", f"{_f(fl.critic_recompute_extra / PF)} PFLOP", ""))
        total = fl.critic_values + fl.critic_train + fl.critic_recompute_extra
        rows.append(("critic together", f"{_f(total / PF)} PFLOP", f"{_f(gs.critic, 0)} GPU-s"))
    return rows


def _generation(r: PlanReport) -> list[str]:
    g, gs, b = r.generation, r.gpu_seconds, r.kv_bytes_per_token
    bw = r.cluster.hbm_gbps * r.assumptions.generation_bw_fraction
    ctx = g.kv_bytes_per_step / max(1, g.concurrent_sequences) / b
    idle = 1 - gs.generation / gs.generation_held if gs.generation_held else 0.0
    return [
        "",
        f"3. Generation ({count(g.engines, 'engine')} x TP{g.engine_tp}; {_f(bw, 0)} GB/s per GPU assumed)",
        f"   bytes per decode step  {_f(g.bytes_per_decode_step / GB, 2)} GB per engine = weights "
        f"{_f(g.weights_bytes_per_step / GB, 2)} + KV {_f(g.kv_bytes_per_step / GB, 2)} "
        f"({count(g.concurrent_sequences, 'sequence')} x {ctx:,.0f} {noun(round(ctx), 'token')} of context "
        f"x {b:,} B)",
        f"   prefill                {_f(g.prefill_flops_shared / PF)} PFLOP with prefix sharing, "
        f"{_f(g.prefill_flops_unshared / PF)} without; {_f(g.prefill_s, 2)} s, {_f(gs.prefill, 0)} GPU-s",
        f"   KV capacity            {g.kv_tokens_per_engine:,} tokens per engine -> "
        f"{count(g.concurrent_sequences, 'concurrent sequence')} at the mean context "
        f"({count(round(g.kv_tokens_per_sequence), 'token')}; {g.concurrent_at_cap:,} at the cap); "
        f"{g.sequences_per_engine:,} per engine to generate",
        f"   decode                 bulk {count(g.bulk_decode_steps, 'step')} {_f(g.bulk_decode_s)} s"
        f"{' (compute-bound)' if g.compute_bound else ''}, then the tail to {count(g.decode_steps, 'step')} "
        f"{_f(g.tail_s)} s",
        f"   longest completion     {_f(r.seconds.longest_completion_floor)} s sequential decode floor "
        f"({count(r.tokens.per_sample.completion_cap, 'token')}, one per step)",
        f"   wall {_f(g.wall_s)} s; GPU-seconds {_f(gs.generation, 0)} of work, "
        f"{_f(gs.generation_held, 0)} held ({idle:.0%} idle in the tail)",
    ]


def _scoring(r: PlanReport) -> list[str]:
    s, sec = r.scoring, r.seconds
    turns = s.turns
    if turns > 1:
        return [
            "",
            "4. Environments and scoring (CPU pool), multi-turn",
            f"   {count(r.tokens.sequences, 'trajectory', 'trajectories')} x {turns} turns -> {_f(s.core_seconds, 0)} core-s of "
            f"environment runs in {count(s.waves, 'wave')}; a trajectory waits on its environment after every "
            f"turn, so the engines sit idle {_f(sec.scoring_exposed)} s a step waiting on environments "
            f"({_f(sec.scoring_hidden)} s of pool work overlap generation)",
        ]
    out = [
        "",
        "4. Scoring (CPU pool)",
        f"   {count(r.tokens.sequences, 'sample')} -> {_f(s.core_seconds, 0)} core-s: {_f(s.serial_s)} s in "
        f"{count(s.waves, 'wave')} unstreamed; streamed, {_f(sec.scoring_hidden)} s hide behind generation "
        f"and {_f(sec.scoring_exposed)} s are exposed",
    ]
    return out + _fleet(r)


def _fleet(r: PlanReport) -> list[str]:
    """A reward fleet's size against what generation needs of it: the line that says it is the bottleneck."""
    s, sec = r.scoring, r.seconds
    if not s.fleet_nodes:
        return []
    line = (
        f"   reward fleet: {count(s.fleet_nodes, 'node')} x {s.fleet_cpus_per_node} CPUs = "
        f"{count(s.fleet_nodes * s.fleet_cpus_per_node, 'core')} (reward.fleet_nodes, reward.fleet_cpus_per_node)"
    )
    need = s.fleet_nodes_to_keep_up
    if need <= s.fleet_nodes:
        return [line + f"; it keeps up with generation ({count(need, 'node')} would do)"]
    if sec.scoring_exposed > 0:
        return [
            line,
            f"   THE FLEET IS THE BOTTLENECK: the devices wait {_f(sec.scoring_exposed)} s a step for its "
            f"{count(s.waves, 'wave')}; {count(need, 'node')} would keep up with generation",
        ]
    return [
        line + f"; its {count(s.waves, 'wave')} run past generation, behind the forwards that need no reward "
        f"({count(need, 'node')} would keep up with generation itself)"
    ]


def _cycle(r: PlanReport) -> list[str]:
    sec, gs, ov = r.seconds, r.gpu_seconds, r.overlap
    labels = {"scoring": "scoring (exposed)", "switch": "switch (host offload)", "other": "other (measured)"}
    L = ["", "5. Cycle (seconds per step)"]
    L += _rows([(labels.get(n, n), _f(v)) for n, v in r.phases_s.items()])
    L.append(f"   serial cycle              {_f(sec.serial_cycle)} s")
    L += _alltoall(r)
    busy = gs.step_work / gs.step_held if gs.step_held else 0.0
    L.append(
        f"   GPU-seconds per step      {_f(gs.step_held, 0)} held, {_f(gs.step_work, 0)} of them work "
        f"({busy:.0%} busy at the assumed efficiencies; the rest waits: on the longest completion, the "
        "CPU pool, host offloads)"
    )
    if ov is None:
        L.append(
            "   overlapped steady state   none: no separated split of these GPUs fits this layout's "
            "TP x PP and engine TP (see the search)"
        )
    else:
        if r.layout.placement == "colocated":
            which = (
                " (the best split of these GPUs at this layout's TP x PP and engine TP; section 10 ranks all)"
            )
        elif r.layout.synchrony == "sync":
            which = " (this layout with layout.synchrony=async)"
        else:
            which = " (this layout)"
        L.append(
            f"   overlapped steady state   {_f(ov.overlapped_s)} s = max(collection {_f(ov.collection_s)}, "
            f"learning {_f(ov.learning_s)}) on {ov.describe}{which}"
        )
    how = "calibrated with the measured phases" if r.calibrated else "predicted"
    L.append(f"   colocated vs separated on all GPUs, {how} (GPU x seconds per step):")
    L += _rows(
        [("layout", "step s", "GPU-s", "fits")]
        + [
            (row.describe, _f(row.step_s), _f(row.gpu_seconds, 0), "yes" if row.fits else "no")
            for row in r.splits
        ],
        indent="     ",
    )
    return L


_SIDE_A2A = (("critic_train", "the critic's"), ("reward_model", "the reward model's"))


def _alltoall(r: PlanReport) -> list[str]:
    """A mixture of experts' token all-to-all (per trainer GPU per step), inside the phases above."""
    a = r.alltoall
    if a is None:
        return []
    if a.ep == 1:
        return ["   MoE all-to-all            none at EP1 (every rank holds every expert)"]
    return [
        f"   MoE all-to-all (EP{a.ep})    {a.count:,} per GPU per step: NVLink {_f(a.nvlink_bytes / GB, 2)} GB "
        f"per GPU, IB {_f(a.ib_bytes_per_node / GB, 2)} GB per node ({_f(a.ib_bytes / GB, 2)} GB per GPU) "
        f"-> {_f(a.seconds, 2)} s (in train_fwd_bwd and the log-prob forwards"
        + "".join(f"; {who} in its phases" for key, who in _SIDE_A2A if key in a.phases)
        + ")"
    ]


def _publication(r: PlanReport) -> list[str]:
    p = r.publication
    sch = p.schemes
    return (
        ["", f"6. Weight publication: {_f(p.bytes / GB, 2)} GB per engine replica"]
        + _rows(
            [
                (cut.cut, f"{_f(cut.bytes / GB, 2)} GB", f"{_f(cut.gbps, 0)} GB/s", f"{_f(cut.floor_s, 3)} s")
                for cut in p.cuts
            ]
        )
        + [
            f"   over one node's IB ({_f(sch.link_gbps, 0)} GB/s): one copy {sch.one_copy_s:.3f} s; "
            f"{count(sch.replicas, 'replica')} through it {sch.k_replicas_one_bottleneck_s:.2f} s; broadcast tree "
            f"{sch.broadcast_tree_s:.2f} s",
            f"   floor {p.floor_s:.3f} s + pack {p.pack_s:g} + install {p.install_s:g} + validate "
            f"{p.validate_s:g} = {p.total_s:.3f} s",
        ]
    )


def _memory(r: PlanReport) -> list[str]:
    mg = r.memory_gib
    tr, en = mg.trainer, mg.engine
    act = mg.activations_by_recompute
    return [
        "",
        f"7. Memory per GPU (GiB, of {mg.gpu_memory:.0f})",
        f"   trainer (PP stage {tr.stage} of {tr.stages}) {tr.total:.1f} = params {tr.params:.1f} + grads "
        f"{tr.grads:.1f} + optimizer {tr.optimizer:.1f} + activations {tr.activations:.1f} "
        f"({count(tr.in_flight_microbatches, 'microbatch', 'microbatches')} in flight, recompute "
        f"{tr.recompute}) + logits "
        f"{tr.logits:.1f} + runtime {tr.runtime:.1f}" + _critic_parts(r),
        "   activations by recompute: " + ", ".join(f"{k} {v:.1f}" for k, v in act.items()),
        f"   engine {en.total:.1f} = weights {en.weights:.1f} + KV cache {en.kv_cache:.1f} + runtime "
        f"{en.runtime:.1f}",
        *_by_model(r),
        f"   peak {mg.peak_per_gpu:.1f}: "
        + ("fits" if mg.fits else "DOES NOT FIT: " + "; ".join(mg.reasons)),
    ]


def _critic_parts(r: PlanReport) -> str:
    """PPO: the critic's training state and what its working set adds to the policy's (one trains at a time)."""
    tr = r.memory_gib.trainer
    if "critic" not in r.memory_gib.by_model:
        return ""
    beyond = max(0.0, tr.critic_activations - (tr.activations + tr.logits))
    return (
        f" + critic {tr.critic:.1f} (its params, grads and optimizer) + {beyond:.1f} (its activations and values "
        f"{tr.critic_activations:.1f} beyond the policy's: the two train one after the other)"
    )


_ROLES = {"policy": "policy", "critic": "critic", "reference": "reference", "reward_model": "reward model"}
_MOMENTS = {
    "generating": "generating (engine + the trainer's weights)",
    "training": "training",
    "constructing": "building the engine",
    "reference_forward": "reference forward",
    "reward_model_forward": "reward model forward",
}


def _per_param(m) -> list[str]:
    """A trained model's bytes per parameter by part: params, grads, optimizer (as full/shards when the
    distributed optimizer divides it evenly; a mixture of experts' shards differ, so the mean then)."""
    n = m.parameters / GIB_B  # the parts are in GiB
    parts = [f"{m.params / n:.3g}", f"{m.grads / n:.3g}"]
    shards = m.optimizer_shards or 1
    full = m.optimizer * shards / n
    if shards > 1 and abs(full - round(full)) < 1e-6:
        parts.append(f"{round(full)}/{shards}")
    else:
        parts.append(f"{m.optimizer / n:.3g}")
    return parts


def _by_model(r: PlanReport) -> list[str]:
    """Each model's share of a trainer GPU (a trained one checkable as parameters x bytes per parameter),
    then every moment's total."""
    mg = r.memory_gib
    tr = mg.trainer
    rows = [
        ("model", "params here", "B/param", "params", "grads", "optimizer", "activations", "on the device")
    ]
    for role, m in mg.by_model.items():
        how = f"{m.bytes_per_param:.3g}"
        if m.state is not None and m.parameters:
            how += " = " + " + ".join(_per_param(m))
        output = m.logits if m.logits is not None else m.values
        act = "" if m.activations is None else f"{m.activations:.1f}" + (f" + {output:.1f}" if output else "")
        rows.append(
            (
                _ROLES.get(role, role),
                _count(m.parameters),
                how,
                f"{m.params:.1f}",
                "" if m.grads is None else f"{m.grads:.1f}",
                "" if m.optimizer is None else f"{m.optimizer:.1f}",
                act,
                m.on_device or "",
            )
        )
    out = [
        f"   by model, per GPU of PP stage {tr.stage} (params + grads + optimizer = params here x B/param):"
    ]
    out += _rows(rows, indent="     ")
    if mg.moments:
        out.append("   moments: " + ", ".join(f"{_MOMENTS.get(k, k)} {v:.1f}" for k, v in mg.moments.items()))
    return out


def _reliability(r: PlanReport) -> list[str]:
    rel = r.reliability
    ck = rel.checkpoint
    L = ["", "8. Checkpoints and failures"]
    L.append(
        f"   checkpoint {_f(ck.bytes / GB)} GB ({ck.bytes_per_param} B/param): write {_f(ck.write_s)} s at "
        f"{_f(r.cluster.storage_gbps, 0)} GB/s; blocks training {ck.blocking_s:.2f} s"
        + (" (async: staging copy)" if ck.async_save else "")
    )
    L.append(
        f"   job MTBF {rel.job_mtbf_s / 3600:.1f} h ({count(rel.nodes, 'node')}): {rel.expected_failures:.2f} "
        f"expected failures; Young/Daly interval {rel.young_daly_interval_s:.0f} s "
        f"({rel.young_daly_interval_if_sync_s:.0f} s if saves were synchronous) = "
        f"{every(rel.interval_steps_optimal, 'step')}"
    )
    if rel.interval_source == "never":
        L.append(
            f"   the recipe never saves (checkpoint.interval=0): each failure restarts from step 0, expected "
            f"lost {rel.expected_lost_s / 3600:.2f} h; set checkpoint.interval=-1 (Young/Daly) or "
            f"{rel.interval_steps_optimal}"
        )
    else:
        L.append(
            f"   saving {every(rel.interval_steps, 'step')} ({rel.interval_source.replace('_', '/')}): "
            f"expected lost {rel.expected_lost_s / 3600:.2f} h ({rel.lost_per_failure_s:.0f} s per "
            f"failure) + saves {rel.save_overhead_s / 3600:.2f} h"
        )
    return L


def _cost(r: PlanReport) -> list[str]:
    return render_cost(r.cost)


def _target(r: PlanReport) -> list[str]:
    tg = r.target
    L = ["", "9. Target"]
    L.append(
        f"   {count(tg.steps, 'step')} predicted in {tg.predicted_hours:.1f} h vs {tg.hours:g} h target: "
        + ("MET" if r.meets_target else "NOT MET")
        + f" (margin {tg.margin_hours:+.1f} h; {count(tg.steps_in_target, 'step')} fit in the target)"
    )
    if tg.predicted_hours_with_young_daly is not None:
        L.append(
            f"   with Young/Daly checkpoints (checkpoint.interval=-1) it would take "
            f"{tg.predicted_hours_with_young_daly:.1f} h"
        )
    return L


def _calibration(r: PlanReport) -> list[str]:
    cal = r.calibration
    if cal is None:
        return []
    rows = [("phase", "measured", "predicted", "calibration")]
    for name, v in cal.measured_s.items():
        pred = cal.predicted_s.get(name)
        ratio = cal.factors.get(name)
        how = f"x{ratio:.2f}" if ratio else "measured"
        if name in cal.offsets:
            how = f"{cal.offsets[name]:+.2f} s"
        rows.append((name, _f(v, 2), _f(pred, 2) if pred is not None else "-", how))
    return (
        ["", f"Calibration from {count(cal.steps, 'measured step')} (median seconds; measured / predicted)"]
        + _rows(rows)
        + ["   what if we separate the pools: the calibrated rows of the table in section 5"]
    )


def _search(r: PlanReport) -> list[str]:
    sr = r.search
    if sr is None:
        return []
    L = [
        "",
        f"11. Layout search over {count(sr.gpus, 'GPU')}: {count(sr.evaluated, 'candidate layout')}; ranked "
        f"by step time, {count(sr.accepted, 'fitting option')} (a separated layout counts as sync and as async)",
    ]
    L += _rows(
        [("#", "layout", "step s", "peak GiB")]
        + [(i + 1, row.describe, _f(row.step_s), _f(row.peak_gib)) for i, row in enumerate(sr.ranked)],
        left=2,
    )
    if sr.rejected_by_kind:
        L.append("   rejected: " + ", ".join(f"{n} for {k}" for k, n in sr.rejected_by_kind.items()))
        L += [f"     {ex.layout}: {ex.reason}" for ex in sr.rejected_examples]
    return L


def _dominant(r: PlanReport) -> list[str]:
    d = r.dominant
    return [
        "",
        "Which phase dominates",
        f"   GPU-seconds: {d.gpu_seconds}; wall time: {d.wall}.",
        "   " + d.why,
    ]


SECTIONS = (
    _header,
    _tokens,
    _compute,
    _generation,
    _scoring,
    _cycle,
    _publication,
    _memory,
    _reliability,
    _target,
    _cost,
    _calibration,
    _search,
    _dominant,
)


def render(r: PlanReport) -> str:
    """The whole report: each section's lines in order, newline-terminated."""
    return "\n".join(line for section in SECTIONS for line in section(r)) + "\n"
