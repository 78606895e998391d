"""benchmarks/peer_trl.py: step walls from span records, medians over repeats, ratios (no TRL needed)."""

from benchmarks.peer_trl import assemble, ours_step_walls, summarize_side


def _spans(step, *rank_spans):
    return {"step": step, "spans_by_rank": [list(r) for r in rank_spans]}


def test_step_walls_span_ends_of_consecutive_steps_slowest_rank():
    records = [{"step": s, "step_seconds": 99.0} for s in (1, 2, 3)]
    spans = [
        _spans(1, [["init", 100.0, 110.0], ["generation", 110.0, 112.0]], [["init", 100.5, 112.5]]),
        _spans(2, [["generation", 112.6, 114.0]], [["train_fwd_bwd", 114.0, 115.0]]),
        _spans(3, [["generation", 115.1, 117.0]], [["publish", 115.2, 116.0]]),
    ]
    assert ours_step_walls(records, spans) == [12.5, 2.5, 2.0]


def test_step_walls_fall_back_to_summed_phases_without_spans():
    records = [{"step": 1, "step_seconds": 3.0}, {"step": 2, "step_seconds": 1.5}]
    assert ours_step_walls(records, []) == [3.0, 1.5]


def _run(steps, **extra):
    return {"step_seconds": steps, "startup_s": 10.0, "completion_tokens": [32.0], "reward": [0.5], **extra}


def test_medians_drop_warmup_and_pool_the_repeats():
    runs = [_run([9.0, 9.0, 1.0, 3.0]), _run([9.0, 9.0, 2.0, 4.0])]
    side = summarize_side(runs, warmup=2)
    assert side["median_step_s"] == 2.5
    assert side["run_medians_s"] == [2.0, 3.0]
    assert side["steps_kept"] == 4
    assert side["completion_tokens_mean"] == 32.0
    assert "phase_medians_s" not in side


def test_ours_phase_medians_and_untimed_rest():
    phases = [{"generation": 5.0, "train_fwd_bwd": 5.0}] * 2 + [{"generation": 1.0, "train_fwd_bwd": 0.5}] * 2
    side = summarize_side([_run([10.0, 10.0, 2.0, 2.0], phases=phases)], warmup=2)
    assert side["phase_medians_s"] == {"generation": 1.0, "train_fwd_bwd": 0.5, "untimed": 0.5}


def test_ratio_is_ours_over_trl_and_a_failed_side_has_none():
    sides = {"trl": [_run([0, 0, 2.0])], "ours_auto": [_run([0, 0, 1.0])], "ours_recompute": []}
    out = assemble(sides, warmup=2, errors={"ours_recompute": "exit code 1"})
    assert out["ratio_auto"] == 0.5
    assert out["ratio_recompute"] is None
    assert out["ours_recompute"] == {"error": "exit code 1"}
