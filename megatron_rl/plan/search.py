"""Search the layouts of a GPU count: trainer TP/PP/DP, engine TP and count, colocated or separated.

Every candidate uses all the GPUs. Trainer TP and engine TP stay inside a node (their collectives
run once per layer); PP divides the layers; DP and the engine count follow from the rest; a mixture
of experts also tries every EP size that divides its experts and a stage's TP x DP ranks. Each
candidate takes the cheapest activation recompute that fits in memory, and is ranked by its
predicted step time (serial when colocated or synchronous, the overlapped steady state when
separated and one-step asynchronous). A rejected candidate keeps the first reason it failed: a
divisibility rule, a collective that would cross nodes, or the memory it needs.
"""

from __future__ import annotations

import dataclasses

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.cycle import Cycle, cycle, lightest_fitting, split_options
from megatron_rl.plan.inputs import PlanInputs

TP_OPTIONS = (1, 2, 4, 8)
PP_OPTIONS = (1, 2, 4, 8, 16)
ENGINE_TP_OPTIONS = (1, 2, 4, 8)
EP_OPTIONS = (1, 2, 4, 8, 16, 32)  # a mixture of experts only; a dense model searches EP 1
# Every candidate starts from selective recompute (`lightest_fitting` then picks the cheapest that fits)
# and, on a GPU cluster, sequence parallelism. The CPU build's trainer refuses sequence parallelism
# (check/rules.py `layout`), so a CPU cluster's candidates go without: ranking a layout the driver
# refuses would also give it the recipe's own description at another step time.
CANDIDATE = dict(recompute="selective")


def structural_reason(inp: PlanInputs, layout: ParallelLayout) -> str | None:
    """Why a layout cannot run at all, before any memory is counted; None if it can.

    The rules are the run's own (`ParallelLayout.check`, what `validate` applies to a recipe), minus
    what only the driver lacks today (kind "driver"); a collective that would cross nodes is named
    first. One rule is the search's own: a DP rank without a whole micro batch of a minibatch would sit idle.
    """
    problems = [p for p in layout.check(inp.spec, inp.hw) if p.kind == "recipe"]
    problems.sort(key=lambda p: _kind(p.message) != "topology")
    if problems:
        return str(problems[0])
    c = inp.critic
    if c is not None and (c.tp or c.pp):  # a critic at its own TP x PP must split these trainer ranks too
        tp, pp, dp = c.tp or layout.tp, c.pp or layout.pp, layout.model_dp(c.tp, c.pp)
        if not dp:
            return f"critic.tp x critic.pp = {tp} x {pp} does not divide the trainer's {layout.trainer_world} ranks"
        per_minibatch = inp.work.samples // inp.work.minibatches
        if per_minibatch % dp:  # validate's rule (check/ppo.py critic_split_problems)
            return f"the critic's DP{dp} does not split a minibatch of {per_minibatch:,} sequences evenly"
    per_minibatch = inp.work.samples // inp.work.minibatches
    mbs = inp.work.micro_batch_size
    if per_minibatch < layout.dp * mbs:
        return (
            f"DP{layout.dp} x micro batch {mbs} needs {layout.dp * mbs:,} sequences per minibatch, which has "
            f"{per_minibatch:,} (idle ranks)"
        )
    return None


def ep_options(inp: PlanInputs, tp: int, dp: int) -> list[int]:
    """Expert-parallel sizes to try: 1 for a dense model; for a mixture of experts every size of
    EP_OPTIONS that divides the experts and the TP x DP ranks of a stage (ETP stays 1)."""
    s = inp.spec
    if not s.is_moe:
        return [1]
    return [ep for ep in EP_OPTIONS if s.num_experts % ep == 0 and (tp * dp) % ep == 0]


def candidates(inp: PlanInputs, total_gpus: int) -> list[ParallelLayout]:
    """Every colocated layout and every separated split (sync) of `total_gpus` GPUs (and, for a
    mixture of experts, every expert-parallel size of each)."""
    out = []
    sp = not inp.hw.is_cpu
    for tp in TP_OPTIONS:
        for pp in PP_OPTIONS:
            unit = tp * pp
            for etp in ENGINE_TP_OPTIONS:
                if total_gpus % unit == 0 and total_gpus % etp == 0:
                    dp = total_gpus // unit
                    out += [
                        ParallelLayout(
                            tp=tp,
                            pp=pp,
                            dp=dp,
                            ep=ep,
                            engine_tp=etp,
                            engine_count=total_gpus // etp,
                            sequence_parallel=sp,
                            **CANDIDATE,
                        )
                        for ep in ep_options(inp, tp, dp)
                    ]
                for engine_gpus in split_options(total_gpus, inp.hw.gpus_per_node):
                    trainer_gpus = total_gpus - engine_gpus
                    if trainer_gpus % unit or engine_gpus % etp:
                        continue
                    dp = trainer_gpus // unit
                    out += [
                        ParallelLayout(
                            tp=tp,
                            pp=pp,
                            dp=dp,
                            ep=ep,
                            engine_tp=etp,
                            engine_count=engine_gpus // etp,
                            placement="separated",
                            sequence_parallel=sp,
                            **CANDIDATE,
                        )
                        for ep in ep_options(inp, tp, dp)
                    ]
    return out


def _as_recipe(inp: PlanInputs, layout: ParallelLayout, option: ParallelLayout) -> ParallelLayout:
    """`option` with the cheapest recompute that fits, unless it is the recipe's own layout (at either
    synchrony): that row is the recipe's step, at its own recompute, as the header and the cycle above
    it state (the search ranks the lighter recompute as another layout)."""
    if option.with_(recompute=layout.recompute, synchrony=layout.synchrony) == layout:
        return option.with_(recompute=layout.recompute)
    return lightest_fitting(inp, option)


def _split(inp: PlanInputs, layout: ParallelLayout, option: ParallelLayout) -> ParallelLayout | None:
    """`option` as a row of the splits table: the largest expert-parallel size, up to the recipe's, that
    the split's ranks can carve (its DP changed), when the search's own rules admit it; None when no
    size does: a layout the search rejects is not offered as an alternative."""
    for ep in sorted((e for e in range(1, layout.ep + 1) if layout.ep % e == 0), reverse=True):
        trial = option.with_(ep=ep)
        if structural_reason(inp, trial) is None:
            return _as_recipe(inp, layout, trial)
    return None


def compare_splits(inp: PlanInputs, layout: ParallelLayout) -> list[Cycle]:
    """Colocated vs separated (sync and async) on all the cluster's GPUs, with this layout's TP/PP/engine TP."""
    total = inp.hw.gpus
    unit = layout.tp * layout.pp * layout.cp
    options = []
    if total % unit == 0 and total % layout.engine_tp == 0:
        colo = layout.with_(placement="colocated", synchrony="sync", dp=total // unit)
        options.append(colo.with_(engine_count=total // layout.engine_tp))
    for engine_gpus in split_options(total, inp.hw.gpus_per_node):
        trainer_gpus = total - engine_gpus
        if trainer_gpus % unit or engine_gpus % layout.engine_tp:
            continue
        sep = layout.with_(
            placement="separated", dp=trainer_gpus // unit, engine_count=engine_gpus // layout.engine_tp
        )
        options += [sep.with_(synchrony="sync"), sep.with_(synchrony="async")]
    rows = [_split(inp, layout, option) for option in options]
    return [cycle(inp, row) for row in rows if row is not None]


def _kind(reason: str) -> str:
    if "GiB" in reason or "KV cache" in reason:
        return "memory"
    if "inside one node" in reason or "inside a node" in reason:
        return "topology"
    return "divisibility"


def search(inp: PlanInputs, total_gpus: int | None = None) -> dict:
    """Rank every layout of `total_gpus` (default: the cluster's) by predicted step time.

    A separated candidate that fits is ranked twice, synchronous and one-step asynchronous.
    """
    total = total_gpus or inp.hw.gpus
    hw = dataclasses.replace(inp.hw, nodes=max(1, total // inp.hw.gpus_per_node))
    inp = dataclasses.replace(inp, hw=hw)
    accepted: list[Cycle] = []
    rejected: list[dict] = []
    cands = candidates(inp, total)
    for cand in cands:
        reason = structural_reason(inp, cand)
        if reason:
            rejected.append({"layout": cand.describe(), "reason": reason, "kind": _kind(reason)})
            continue
        lay = lightest_fitting(inp, cand)
        cyc = cycle(inp, lay)
        if not cyc.fits or cyc.gen.reasons:
            reason = cyc.reasons[0]
            rejected.append({"layout": lay.describe(), "reason": reason, "kind": _kind(reason)})
            continue
        accepted.append(cyc)
        if not lay.colocated:  # the same pools, pipelined: the same phases, a different step
            accepted.append(cyc.pipelined())
    accepted.sort(key=lambda c: (c.step_s, c.memory["peak"]))
    kinds: dict[str, int] = {}
    for r in rejected:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    return {
        "gpus": total,
        "candidates": len(cands),
        "ranked": accepted,
        "rejected": rejected,
        "rejected_by_kind": kinds,
    }


def best_step_s(inp: PlanInputs, total_gpus: int) -> float:
    """The fastest predicted step over every layout of `total_gpus`; inf when none fits."""
    ranked = search(inp, total_gpus)["ranked"]
    return ranked[0].step_s if ranked else float("inf")
