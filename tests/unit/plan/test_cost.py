"""The plan's cost: on-demand against spot, by hand from the reliability arithmetic it reuses."""

from __future__ import annotations

import dataclasses
import math

import pytest

from megatron_rl.plan.cost import cost, render_cost
from megatron_rl.plan.reliability import RESTART_FIXED_S, reliability


def priced(inp, on_demand=3.0, spot=1.5, preemptions=0.5):
    hw = dataclasses.replace(
        inp.hw, gpu_hour_usd=on_demand, spot_gpu_hour_usd=spot, spot_preemptions_per_node_day=preemptions
    )
    return dataclasses.replace(inp, hw=hw)


def test_on_demand_is_the_steps_and_the_failures_at_the_price(ref):
    inp, layout = ref
    inp = priced(inp)
    step_s = 100.0
    c = cost(inp, layout, step_s, RESTART_FIXED_S)
    gpus = layout.gpus
    assert c.gpus == gpus == 256
    # The buyer's first question, exactly: steps x s/step / 3600 x GPUs x price.
    assert c.compute_hours == pytest.approx(inp.work.steps * step_s / 3600)
    assert c.compute_usd == pytest.approx(inp.work.steps * step_s / 3600 * gpus * 3.0)
    rel = reliability(inp, layout, step_s)
    assert c.on_demand.hours == pytest.approx(rel["total_s"] / 3600)
    assert c.on_demand.usd == pytest.approx(rel["total_s"] / 3600 * gpus * 3.0)
    assert c.on_demand.usd > c.compute_usd, "start-up, saves and lost work are paid for too"
    nodes = 32
    assert c.on_demand.job_interruptions_per_day == pytest.approx(nodes / inp.hw.node_mtbf_s * 86400)


def test_spot_is_interrupted_more_saves_more_often_and_wins_only_on_price(ref):
    inp, layout = ref
    step_s = 100.0
    c = cost(priced(inp), layout, step_s, RESTART_FIXED_S)
    s, d = c.spot, c.on_demand
    node_per_day = 86400 / inp.hw.node_mtbf_s + 0.5
    assert s.job_interruptions_per_day == pytest.approx(32 * node_per_day)
    assert s.expected_interruptions == pytest.approx(
        d.expected_interruptions * node_per_day / (86400 / inp.hw.node_mtbf_s)
    )
    assert s.lost_hours > d.lost_hours and s.hours > d.hours
    assert s.usd == pytest.approx(s.hours * 256 * 1.5) and c.cheaper == "spot"
    # Young/Daly's interval shrinks as sqrt(MTBF) when the recipe asks for it (checkpoint.interval=-1).
    yd = dataclasses.replace(inp, assume=dataclasses.replace(inp.assume, checkpoint_interval_steps=-1))
    slow = 2000.0  # long steps: the optimal interval is a whole number of them, above 1
    c2 = cost(priced(yd), layout, slow, RESTART_FIXED_S)
    assert c2.spot.interval_source == "young_daly" and c2.spot.interval_steps <= c2.on_demand.interval_steps
    # Preempted often enough, the cheaper price loses.
    dear = cost(priced(inp, preemptions=200.0), layout, step_s, RESTART_FIXED_S)
    assert dear.spot.usd > dear.on_demand.usd and dear.cheaper == "on_demand"
    assert math.isfinite(dear.spot.usd)


def test_unpriced_clusters_show_gpu_hours_and_say_which_keys_price_them(ref):
    inp, layout = ref
    c = cost(priced(inp, on_demand=0.0, spot=0.0), layout, 100.0, RESTART_FIXED_S)
    assert c.spot is None and c.on_demand.usd == 0.0
    text = "\n".join(render_cost(c))
    assert "GPU-hours of steps; set cluster.gpu_hour_usd" in text
    only = "\n".join(render_cost(cost(priced(inp, spot=0.0), layout, 100.0, RESTART_FIXED_S)))
    assert "spot: not priced (cluster.spot_gpu_hour_usd=0)" in only and "on-demand $3/GPU-h" in only


def test_the_report_prices_the_shipped_cluster(ref):
    from megatron_rl.plan.report import build_report

    c = build_report(*ref, with_search=False).to_json()["cost"]
    assert c["on_demand"]["gpu_hour_usd"] == 3.0 and c["spot"]["gpu_hour_usd"] == 1.5
    assert c["on_demand"]["usd"] > c["compute_usd"] > 0 and c["cheaper"] in ("spot", "on_demand")


def test_spare_nodes_are_paid_for_all_along_and_fail_nothing(ref):
    """Two spare nodes of 8 GPUs: 16 more GPUs on the bill for the whole run; the interruptions are the run's
    nodes' only (an idle spare that fails is not the run's failure)."""
    inp, layout = ref
    inp = priced(inp)
    spared = dataclasses.replace(inp, hw=dataclasses.replace(inp.hw, spare_nodes=2))
    base, c = cost(inp, layout, 100.0, RESTART_FIXED_S), cost(spared, layout, 100.0, RESTART_FIXED_S)
    assert (c.gpus, c.spare_gpus) == (272, 16)
    assert c.compute_usd == pytest.approx(base.compute_usd * 272 / 256)
    assert c.on_demand.hours == pytest.approx(base.on_demand.hours)
    assert c.on_demand.usd == pytest.approx(base.on_demand.usd * 272 / 256)
    assert "272 GPUs (16 spare GPUs among them)" in "\n".join(render_cost(c))
