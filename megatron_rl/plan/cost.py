"""The run's price: on-demand against spot capacity, each with the checkpoints and lost work it needs.

The base is the issue every buyer asks first: steps x seconds per step / 3600 x GPUs x price per
GPU-hour, the spare nodes' GPUs (cluster.spare_nodes) counted with the run's: they are rented all along. The whole bill adds what failures cost (reliability.py): the start-up, the time saves block
training, and the expected lost work (half a checkpoint interval, the write in flight and a restart,
per interruption). On-demand nodes are interrupted by their own failures (cluster.node_mtbf_days);
spot nodes also by the provider taking them back (cluster.spot_preemptions_per_node_day), so a spot
job is interrupted more often, wants a shorter Young/Daly interval and loses more work: it is cheaper
only when its price advantage outweighs that. The restart is the planner's (300 s assumed; the run's
measured `init` phase with --from-steps); waiting for spot capacity to come back is not modelled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import PlanInputs
from megatron_rl.plan.reliability import reliability
from megatron_rl.plan.wording import count, every

DAY_S = 86400.0


@dataclass(frozen=True)
class Capacity:
    """One way to rent the GPUs for the whole run."""

    kind: str  # on_demand | spot
    gpu_hour_usd: float
    job_interruptions_per_day: float  # failures (and, on spot, preemptions) of any of the run's nodes
    expected_interruptions: float
    interval_steps: int  # the checkpoint cadence this capacity runs with (0: never saves)
    interval_source: str  # recipe | young_daly | never
    interval_steps_optimal: int  # Young/Daly's for this capacity's interruption rate
    lost_hours: float  # expected work redone and restarts
    save_hours: float  # time the saves block training
    hours: float  # the whole run, start-up included
    usd: float


@dataclass(frozen=True)
class Cost:
    gpus: int  # billed: the run's and the spares'
    spare_gpus: int
    compute_hours: float  # steps x seconds per step / 3600: no failure, no save, no start-up
    compute_usd: float  # compute_hours x GPUs x the on-demand price
    on_demand: Capacity
    spot: Capacity | None  # None when the cluster names no spot price
    cheaper: str  # on_demand | spot


def billed_gpus(inp: PlanInputs, layout: ParallelLayout) -> int:
    """The GPUs the run pays for: its own and its spare nodes'."""
    return layout.gpus + inp.hw.spare_nodes * inp.hw.gpus_per_node


def _capacity(kind, price, inp, layout, step_s, restart_s, preemptions_per_node_day) -> Capacity:
    node_rate = 1.0 / inp.hw.node_mtbf_s + preemptions_per_node_day / DAY_S  # interruptions per node-second
    hw = dataclasses.replace(inp.hw, node_mtbf_s=1.0 / node_rate)
    rel = reliability(dataclasses.replace(inp, hw=hw), layout, step_s, restart_fixed_s=restart_s)
    hours = rel["total_s"] / 3600
    return Capacity(
        kind=kind,
        gpu_hour_usd=price,
        job_interruptions_per_day=DAY_S / rel["job_mtbf_s"],
        expected_interruptions=rel["expected_failures"],
        interval_steps=rel["interval_steps"],
        interval_source=rel["interval_source"],
        interval_steps_optimal=rel["interval_steps_optimal"],
        lost_hours=rel["expected_lost_s"] / 3600,
        save_hours=rel["save_overhead_s"] / 3600,
        hours=hours,
        usd=hours * billed_gpus(inp, layout) * price,
    )


def cost(inp: PlanInputs, layout: ParallelLayout, step_s: float, restart_s: float) -> Cost:
    """The run on on-demand capacity and, when the cluster prices it, on spot."""
    hw = inp.hw
    compute_hours = inp.work.steps * step_s / 3600
    on_demand = _capacity("on_demand", hw.gpu_hour_usd, inp, layout, step_s, restart_s, 0.0)
    spot = None
    if hw.spot_gpu_hour_usd > 0:
        spot = _capacity(
            "spot", hw.spot_gpu_hour_usd, inp, layout, step_s, restart_s, hw.spot_preemptions_per_node_day
        )
    return Cost(
        gpus=billed_gpus(inp, layout),
        spare_gpus=billed_gpus(inp, layout) - layout.gpus,
        compute_hours=compute_hours,
        compute_usd=compute_hours * billed_gpus(inp, layout) * hw.gpu_hour_usd,
        on_demand=on_demand,
        spot=spot,
        cheaper="spot" if spot is not None and spot.usd < on_demand.usd else "on_demand",
    )


def _h(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.2g}"


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _line(c: Capacity, label: str) -> str:
    cadence = "never saves" if c.interval_source == "never" else f"saves {every(c.interval_steps, 'step')}"
    if c.interval_source == "recipe" and c.interval_steps_optimal != c.interval_steps:
        cadence += f" (Young/Daly for this rate: {every(c.interval_steps_optimal, 'step')})"
    return (
        f"   {label:<9} ${c.gpu_hour_usd:g}/GPU-h: {c.hours:.1f} h, {_usd(c.usd)}; "
        f"{c.job_interruptions_per_day:.2g} interruptions/day ({c.expected_interruptions:.2f} expected), "
        f"{cadence}, lost {c.lost_hours:.2f} h + saves {c.save_hours:.2f} h"
    )


def render_cost(c: Cost) -> list[str]:
    """The report's cost section."""
    lines = ["", "10. Cost"]
    spares = f" ({count(c.spare_gpus, 'spare GPU')} among them)" if c.spare_gpus else ""
    if c.on_demand.gpu_hour_usd <= 0:
        return lines + [
            f"   {_h(c.compute_hours)} h x {count(c.gpus, 'GPU')}{spares} = {_h(c.compute_hours * c.gpus)} GPU-hours "
            "of steps; set cluster.gpu_hour_usd (and spot_gpu_hour_usd, spot_preemptions_per_node_day) "
            "to price them"
        ]
    lines.append(
        f"   steps alone: {c.compute_hours:.1f} h x {count(c.gpus, 'GPU')}{spares} x ${c.on_demand.gpu_hour_usd:g} = "
        f"{_usd(c.compute_usd)}; with start-up, saves and the expected failures:"
    )
    lines.append(_line(c.on_demand, "on-demand"))
    if c.spot is None:
        lines.append("   spot: not priced (cluster.spot_gpu_hour_usd=0)")
        return lines
    lines.append(_line(c.spot, "spot"))
    saving = c.on_demand.usd - c.spot.usd
    lines.append(
        f"   cheaper: {c.cheaper.replace('_', '-')} by {_usd(abs(saving))}"
        + (f", {c.spot.hours - c.on_demand.hours:.1f} h later" if c.cheaper == "spot" else "")
    )
    return lines
