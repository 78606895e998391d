"""Phase times and cycles by hand, and the properties every plan must keep."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.cycle import cycle, switch_seconds, trainer_phases
from megatron_rl.plan.memory import memory_fit
from megatron_rl.plan.search import CANDIDATE, best_step_s

from .hand import HAND_LAYOUT, hand_inputs

SLOW = {"peak_flops": 1000.0}  # 500 FLOP/s at MFU 0.5: the hand model's FLOPs become seconds


def test_trainer_phases_by_hand():
    ph = trainer_phases(hand_inputs(hw=SLOW), HAND_LAYOUT)
    # train 4 x 6,768 + selective recompute 4 x 192 = 27,840 FLOPs; old / ref forwards 4 x 2,256 each.
    assert ph["train_fwd_bwd"] == pytest.approx(27_840 / 500)
    assert ph["old_logprobs"] == pytest.approx(9_024 / 500)
    assert ph["ref_logprobs"] == pytest.approx(9_024 / 500)
    assert ph["optimizer"] == 0.0  # DP1: nothing to reduce


def test_dp_imbalance_and_optimizer_traffic_by_hand():
    inp = hand_inputs(hw=SLOW)
    ph = trainer_phases(inp, HAND_LAYOUT.with_(dp=3))
    # 4 sequences over 3 DP ranks: the busiest holds 2 -> 2 x 3 / 4 = 1.5x the even share.
    assert ph["train_fwd_bwd"] == pytest.approx(27_840 / (3 * 500) * 1.5)
    # reduce-scatter fp32 grads + all-gather bf16 params: 388 params x 6 B x (3-1)/3 per GPU, and the
    # DP group (3 ranks) spans nodes of 2 GPUs -> each GPU's share of the node's IB, 10 / 2 B/s.
    assert ph["optimizer"] == pytest.approx(388 * 6 * 2 / 3 / 5)


def test_pipeline_bubble_by_hand():
    inp = hand_inputs(hw=SLOW)
    ph = trainer_phases(inp, HAND_LAYOUT.with_(pp=2))
    # PP2 with 4 microbatches per minibatch: bubble (2 - 1) / 4. Plus the pipeline sends: 4
    # microbatches x 2 passes x (3 tokens x hidden 4 x 2 B) over NVLink (stages 1 rank apart) at 100 B/s.
    p2p = 4 * 2 * (3 * 4 * 2) / 100
    assert ph["train_fwd_bwd"] == pytest.approx(27_840 / (2 * 500) * (1 + 1 / 4) + p2p)
    assert ph["old_logprobs"] == pytest.approx(9_024 / (2 * 500) * (1 + 1 / 4) + p2p / 2)


def test_colocated_switch_by_hand():
    inp = hand_inputs()
    mem = memory_fit(inp, HAND_LAYOUT)
    tr, en = mem["trainer"], mem["engine"]
    # offload and reload grads (388 x 4 B) and optimizer (388 x 12 B), and the level-1 engine's weights.
    assert tr["grads"] == 388 * 4 and tr["optimizer"] == 388 * 12 and en["weights"] == 776
    expected = (2 * (388 * 4 + 388 * 12) + 2 * 776) / 25e9
    assert switch_seconds(inp, HAND_LAYOUT, mem) == pytest.approx(expected)
    assert switch_seconds(inp, HAND_LAYOUT.with_(placement="separated"), mem) == 0.0


def test_serial_and_overlapped_cycles():
    inp = hand_inputs(hw=SLOW)
    c = cycle(inp, HAND_LAYOUT)
    assert c.serial_s == pytest.approx(sum(c.phases.values()))
    # the collection path waits for every reward: the scoring the serial cycle hides behind its forwards too
    collection = c.phases["generation"] + c.phases["scoring"] + c.scoring["behind_forwards_s"]
    learning = sum(
        c.phases[k] for k in ("old_logprobs", "ref_logprobs", "train_fwd_bwd", "optimizer", "publish")
    )
    assert c.collection_s == pytest.approx(collection)
    assert c.learning_s == pytest.approx(learning)
    assert c.overlapped_s == pytest.approx(max(collection, learning))
    assert c.step_s == c.serial_s  # colocated runs serially
    sep = ParallelLayout(
        tp=1,
        pp=1,
        dp=1,
        engine_tp=1,
        engine_count=1,
        placement="separated",
        **CANDIDATE,
    )
    assert cycle(inp, sep).step_s == cycle(inp, sep).serial_s
    asyn = cycle(inp, sep.with_(synchrony="async"))
    assert asyn.step_s == asyn.overlapped_s < asyn.serial_s
    assert "switch" not in asyn.phases


def test_scoring_hides_behind_the_forwards_that_need_no_reward():
    """Synchronous, the batch comes when generation ends: the switch and the reference and old
    log-prob forwards run while the pool scores, and only what they leave is exposed; a run that waits
    for its rewards first (dynamic sampling, partial rollouts, turns) exposes it all, and an asynchronous
    one overlaps the whole collection instead."""
    slow_pool = {"seconds_per_sample": 30.0, "pool_cores": 1}
    waits = cycle(hand_inputs(work={**slow_pool, "defer_scoring": False}, hw=SLOW), HAND_LAYOUT)
    defers = cycle(hand_inputs(work=slow_pool, hw=SLOW), HAND_LAYOUT)
    cover = sum(defers.phases.get(p, 0.0) for p in ("switch", "old_logprobs", "ref_logprobs"))
    assert 0 < cover < waits.phases["scoring"]  # the case where the forwards hide part of it
    assert defers.phases["scoring"] == pytest.approx(waits.phases["scoring"] - cover)
    assert defers.scoring["behind_forwards_s"] == pytest.approx(cover)
    assert defers.serial_s == pytest.approx(waits.serial_s - cover)
    quick = cycle(hand_inputs(work={"seconds_per_sample": 1e-6, "pool_cores": 64}, hw=SLOW), HAND_LAYOUT)
    assert quick.phases["scoring"] == 0.0  # never below zero: the forwards cover it all
    sep = ParallelLayout(tp=1, pp=1, dp=1, engine_tp=1, engine_count=1, placement="separated", **CANDIDATE)
    asyn = sep.with_(synchrony="async")
    assert cycle(hand_inputs(work=slow_pool, hw=SLOW), asyn).phases["scoring"] == waits.phases["scoring"]


# ---- properties on the reference recipe ----


def test_more_gpus_never_predict_a_slower_step(ref):
    inp, _ = ref
    best = [best_step_s(inp, nodes * 8) for nodes in (2, 4, 8, 16, 32, 64)]
    assert all(b < float("inf") for b in best)
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(best, best[1:])), best


def test_scaling_one_layout_pattern_never_slows_it(ref):
    inp, _ = ref
    steps = []
    for gpus in (32, 64, 128, 256, 512):
        lay = ParallelLayout(
            tp=8,
            pp=2,
            dp=gpus // 16,
            engine_tp=4,
            engine_count=gpus // 4,
            **CANDIDATE,
        )
        steps.append(cycle(inp, lay).step_s)
    assert all(later <= earlier for earlier, later in zip(steps, steps[1:])), steps


def test_longer_completions_never_predict_a_cheaper_step(ref):
    inp, layout = ref

    def plan(**work):
        c = cycle(dataclasses.replace(inp, work=dataclasses.replace(inp.work, **work)), layout)
        return c.step_s, c.gpu_seconds, c.gen.gpu_seconds

    means = [plan(completion_tokens=c) for c in (250, 1000, 2500, 5000, 10000, 16384)]
    caps = [plan(max_new_tokens=c) for c in (4096, 8192, 16384, 30000)]
    for series in (means, caps):
        for earlier, later in zip(series, series[1:]):
            assert all(b >= a for a, b in zip(earlier, later)), series


def test_tensor_parallel_collectives_by_hand():
    """Per microbatch and layer: 2 all-reduces forward, 2 more backward; sequence parallelism makes each
    an all-gather plus a reduce-scatter and re-gathers 2 inputs in the backward; full recompute repeats
    the forward's; 4 small vocab ones forward (embedding + cross-entropy), 1 backward. Latency each."""
    from megatron_rl.plan.cycle import _tp_collective_seconds

    inp = hand_inputs()
    inp = dataclasses.replace(inp, hw=dataclasses.replace(inp.hw, allreduce_latency_s=1e-3))
    w, layers = inp.work, inp.spec.num_layers
    mbs = w.samples // w.micro_batch_size

    def tp(backward, **kw):
        lay = HAND_LAYOUT.with_(tp=2, dp=1, pp=1, **kw)
        return _tp_collective_seconds(inp, lay, w.samples, backward)

    plain = dict(sequence_parallel=False, recompute="none")
    assert tp(False, **plain) == pytest.approx(mbs * (2 * layers + 4) * 1e-3)
    assert tp(True, **plain) == pytest.approx(mbs * (4 * layers + 5) * 1e-3)
    sp = dict(sequence_parallel=True, recompute="none")
    assert tp(False, **sp) == pytest.approx(mbs * (4 * layers + 4) * 1e-3)
    assert tp(True, **sp) == pytest.approx(mbs * (10 * layers + 5) * 1e-3)
    full = dict(sequence_parallel=True, recompute="full")
    assert tp(True, **full) == pytest.approx(mbs * (14 * layers + 5) * 1e-3)
    assert _tp_collective_seconds(inp, HAND_LAYOUT.with_(tp=1), w.samples, backward=True) == 0.0
