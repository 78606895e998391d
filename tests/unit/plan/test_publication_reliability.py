"""Weight publication floors and the checkpoint / failure arithmetic, by hand."""

from __future__ import annotations

import math

import pytest

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.publication import publication
from megatron_rl.plan.reliability import checkpoint, reliability, young_daly_interval
from megatron_rl.plan.search import CANDIDATE  # the layouts the search starts from

from .hand import HAND_LAYOUT, hand_inputs

W = 65_527_752_704  # Qwen2.5-32B in bf16
NODE_IB = 8 * 400e9 / 8  # 8 NICs x 400 Gb/s = 400 GB/s
NVLINK = 900e9


def test_reference_publication_by_hand(ref):
    inp, layout = ref
    p = publication(inp, layout)
    assert p["bytes"] == W
    cuts = {c["cut"]: c for c in p["cuts"]}
    # PP is megatron's slowest dimension: nodes 0-15 hold stage 0, nodes 16-31 stage 1 (a whole TP8
    # group each), but each node's two TP4 engines need every layer -> half the weights cross IB.
    assert cuts["IB into one node"]["bytes"] == pytest.approx(W / 2)
    assert cuts["IB into one node"]["floor_s"] == pytest.approx(W / 2 / NODE_IB)
    # An engine GPU needs W / 4; some GPUs hold none of it (trainer slice 1/8 of 8 vs engine slice 1/4 of 4).
    assert cuts["NVLink into one engine GPU"]["floor_s"] == pytest.approx(W / 4 / NVLINK)
    assert p["floor_s"] == pytest.approx(W / 2 / NODE_IB)
    s = p["schemes"]
    assert s["one_copy_s"] == pytest.approx(W / NODE_IB)
    assert s["k_replicas_one_bottleneck_s"] == pytest.approx(64 * W / NODE_IB)
    assert s["broadcast_tree_s"] == pytest.approx(math.ceil(math.log2(65)) * W / NODE_IB)  # 7 hops
    assert p["total_s"] == pytest.approx(p["floor_s"])  # the recipe configures no pack/install/validate


def test_node_holding_whole_replicas_needs_no_ib(ref):
    inp, _ = ref
    p = publication(
        inp,
        ParallelLayout(
            tp=8,
            pp=1,
            dp=32,
            engine_tp=4,
            engine_count=64,
            **CANDIDATE,
        ),
    )
    cuts = {c["cut"]: c for c in p["cuts"]}
    assert cuts["IB into one node"]["bytes"] == 0
    assert p["floor_s"] == pytest.approx(W / 4 / NVLINK)


def test_separated_pools_move_a_full_copy_per_engine_node(ref):
    inp, _ = ref
    lay = ParallelLayout(
        tp=8,
        pp=1,
        dp=1,
        engine_tp=4,
        engine_count=2,
        placement="separated",
        **CANDIDATE,
    )  # 8 + 8 GPUs
    p = publication(inp, lay)
    cuts = {c["cut"]: c for c in p["cuts"]}
    assert cuts["IB into one node"]["bytes"] == pytest.approx(W)
    assert cuts["trainer -> engine pools (1 node link)"]["floor_s"] == pytest.approx(W / NODE_IB)
    assert cuts["NVLink into one engine GPU"]["bytes"] == pytest.approx(W / 4)
    assert p["floor_s"] == pytest.approx(W / NODE_IB)


def test_publication_adds_configured_times():
    inp = hand_inputs(assume={"publish_pack_s": 1.0, "publish_install_s": 2.0, "publish_validate_s": 0.5})
    p = publication(inp, HAND_LAYOUT)
    assert p["total_s"] == pytest.approx(p["floor_s"] + 3.5)


def test_young_daly_by_hand():
    assert young_daly_interval(50.0, 10_000.0) == pytest.approx(math.sqrt(2 * 50 * 10_000) - 50)  # 950
    assert young_daly_interval(6_000.0, 10_000.0) == 10_000.0  # saving costs over half the MTBF
    assert young_daly_interval(0.0, 10_000.0) == 0.0


def test_checkpoint_bytes_and_write_time(ref):
    inp, layout = ref
    ck = checkpoint(inp, layout)
    # bf16 params 2 + fp32 master 4 + Adam m, v 8 = 14 B for the TP8-padded model (32,769,119,232 params).
    assert ck["bytes_per_param"] == 14
    assert ck["bytes"] == 32_769_119_232 * 14
    assert ck["write_s"] == pytest.approx(32_769_119_232 * 14 / 20e9)
    assert ck["async"] and ck["blocking_s"] == pytest.approx(ck["bytes"] / 256 / 25e9)


def test_failures_and_lost_time_by_hand():
    # 10 steps x 100 s on 1 node with a 1,000 s MTBF: 1 expected failure. The hand model's checkpoint:
    # 388 params x 14 B = 5,432 B at 7 B/s = 776 s (sync) -> Young/Daly = MTBF (776 >= 1000 / 2).
    inp = hand_inputs()
    r = reliability(inp, HAND_LAYOUT, step_s=100.0, restart_fixed_s=50.0)
    assert r["expected_failures"] == pytest.approx(1.0)
    assert r["checkpoint"]["write_s"] == pytest.approx(388 * 14 / 7)
    assert r["young_daly_interval_s"] == pytest.approx(1000.0)
    assert r["interval_steps"] == 10 and r["saves"] == 1
    # lost per failure: half an interval (500 s) + restart (50 s + reading 776 s back).
    assert r["lost_per_failure_s"] == pytest.approx(500 + 50 + 776)
    assert r["total_s"] == pytest.approx(50 + 1000 + 776 + 1326)


def test_configured_interval_wins():
    r = reliability(hand_inputs(assume={"checkpoint_interval_steps": 5}), HAND_LAYOUT, step_s=100.0)
    assert r["interval_steps"] == 5 and r["interval_source"] == "recipe" and r["saves"] == 2


def test_never_saving_restarts_from_scratch():
    # 1,000 s of work, job MTBF 1,000 s, restart 50 s: (1,000 + 50) x (e^1 - 1) expected, so
    # 1,050 x 1.71828 - 1,000 = 804.2 s lost on top of the work.
    r = reliability(
        hand_inputs(assume={"checkpoint_interval_steps": 0}), HAND_LAYOUT, 100.0, restart_fixed_s=50.0
    )
    assert r["interval_source"] == "never" and r["saves"] == 0
    assert r["expected_lost_s"] == pytest.approx(1050 * (math.e - 1) - 1000)
    assert r["interval_steps_optimal"] == 10  # what the planner recommends instead
