"""Generation and scoring against the hand model: 776 B of weights read at 776 B/s = 1 s per step."""

from __future__ import annotations

import pytest

from megatron_rl.plan.generation import generation
from megatron_rl.plan.scoring import scoring

from .hand import HAND_LAYOUT, hand_inputs


def test_bandwidth_bound_decode_by_hand():
    g = generation(hand_inputs(), HAND_LAYOUT)
    # One engine gets both prompts: 4 sequences. KV cache 1,600 B / 16 B = 100 tokens; a sequence
    # needs p + c = 3 tokens (no prefix sharing) -> 33 fit, so all 4 run at once.
    assert (g.sequences_per_engine, g.kv_tokens_per_engine, g.concurrent_sequences) == (4, 100, 4)
    assert g.concurrent_at_cap == 100 // (1 + 4)
    # Bytes per step: weights 776 + 4 sequences x 16 B x mean context (1 + (2-1)/2 = 1.5) = 872.
    assert g.bytes_per_decode_step == pytest.approx(872)
    # Bulk: ceil(4 x 2 / 4) = 2 steps reading 2 x 776 + KV 4 x 16 x 3 = 1,744 B at 776 B/s.
    assert g.bulk_decode_steps == 2
    assert g.bulk_decode_s == pytest.approx(1744 / 776, rel=1e-6)
    # Tail to the cap (4): 2 more steps of weights + the long one's KV reads (1+2+3+4) - (1+2) = 7 tokens.
    assert g.tail_s == pytest.approx((2 * 776 + 16 * 7) / 776, rel=1e-6)
    # The longest completion alone: 4 steps of weights + KV of 1+2+3+4 = 10 tokens.
    assert g.longest_completion_floor_s == pytest.approx((4 * 776 + 16 * 10) / 776, rel=1e-6)
    assert g.decode_s == pytest.approx(g.bulk_decode_s + g.tail_s, rel=1e-9)
    assert g.decode_steps == 4
    assert not g.compute_bound
    # Work counts the bulk only; held GPU-seconds the whole wall.
    assert g.gpu_seconds == pytest.approx(g.prefill_s + g.bulk_decode_s)
    assert g.gpu_seconds_held == pytest.approx(g.wall_s)


def test_compute_bound_decode_uses_the_roofline():
    # 500 FLOP/s: bulk FLOPs 4 x (2 x 344 x 2 + 4 x 2 x 4 x 3) = 5,888 -> 11.776 s > 2.25 s of bytes.
    g = generation(hand_inputs(hw={"peak_flops": 1000.0}), HAND_LAYOUT)
    assert g.compute_bound
    assert g.bulk_decode_s == pytest.approx(5888 / 500)
    # Prefill: 4 sequences x 720 FLOPs (no sharing) at 500 FLOP/s.
    assert g.prefill_s == pytest.approx(4 * 720 / 500)
    shared = generation(hand_inputs(hw={"peak_flops": 1000.0}, assume={"prefix_sharing": True}), HAND_LAYOUT)
    assert shared.prefill_s == pytest.approx(2 * 720 / 500)


def test_kv_capacity_limits_concurrency():
    # 8 tokens of KV: 2 sequences of 3 tokens at once -> ceil(4 x 2 / 2) = 4 bulk steps = the cap.
    g = generation(hand_inputs(assume={"kv_cache_bytes": 8 * 16}), HAND_LAYOUT)
    assert g.concurrent_sequences == 2
    assert g.bulk_decode_steps == 4
    assert g.tail_s == pytest.approx(0.0)
    assert not g.reasons  # the longest sequence (prompt cap 2 + completion cap 4 = 6) fits in 8


def test_kv_cache_smaller_than_the_longest_sequence_is_a_reason():
    g = generation(hand_inputs(assume={"kv_cache_bytes": 5 * 16}), HAND_LAYOUT)
    assert g.kv_tokens_per_engine == 5
    assert any("fewer than one longest sequence" in r and "(6 =" in r for r in g.reasons)


def test_more_engines_split_the_bulk_not_the_floor():
    one = generation(hand_inputs(), HAND_LAYOUT)
    two = generation(hand_inputs(), HAND_LAYOUT.with_(engine_count=2))
    assert two.sequences_per_engine == 2
    assert two.longest_completion_floor_s == one.longest_completion_floor_s
    assert two.bulk_decode_s < one.bulk_decode_s


def test_scoring_hidden_behind_generation_by_hand():
    inp = hand_inputs()
    g = generation(inp, HAND_LAYOUT)
    s = scoring(inp, g)
    # 4 samples on 2 cores at 1 s: 2 waves = 2 s unstreamed. Streamed, the bulk is scored by
    # max(bulk end + 1, prefill + 2) = 3.25 s, before generation ends (4.39 s); the longest completion
    # finishes with generation and needs 1 s more: 1 s exposed, 1 s hidden.
    assert (s["waves"], s["serial_s"], s["core_seconds"]) == (2, 2.0, 4.0)
    assert s["exposed_s"] == pytest.approx(1.0)
    assert s["hidden_s"] == pytest.approx(1.0)


def test_slow_pool_exposes_its_backlog():
    inp = hand_inputs(work={"seconds_per_sample": 10.0, "pool_cores": 1})
    g = generation(inp, HAND_LAYOUT)
    s = scoring(inp, g)
    # 4 waves of 10 s from the end of prefill: done at prefill + 40 s; exposed = that - generation's end.
    assert s["serial_s"] == 40.0
    assert s["exposed_s"] == pytest.approx(g.prefill_s + 40.0 - g.wall_s)
    assert s["hidden_s"] == pytest.approx(40.0 - s["exposed_s"])
