"""benchmarks/async.py's arithmetic on hand-built step records (no runs). The module's name is a Python
keyword, so it is imported by string."""

import importlib

import pytest

bench = importlib.import_module("benchmarks.async")


def _record(wall, gen, score, wait, tail, lag, reward=0.5):
    return {
        "wall_seconds": wall,
        "phases": {"generation": {"seconds": gen}, "scoring": {"seconds": score}},
        "rollout_wait_s": wait,
        "generation": {"tail_s": tail},
        "version_lag": {"max": lag, "mean": float(lag)},
        "reward": {"mean": reward},
    }


def test_step_figures_are_shares_of_the_wall_step():
    f = bench.step_figures(_record(2.0, 0.6, 0.4, 0.5, 0.3, 1), processes=2)
    assert f["step_s"] == 2.0 and f["process_s_per_step"] == 4.0
    assert f["trainer_wait_share"] == pytest.approx(0.25)
    assert f["engine_busy_share"] == pytest.approx(0.5)
    assert f["generation_tail_share"] == pytest.approx(0.5)
    assert f["version_lag_max"] == 1


def test_summary_takes_medians_and_the_worst_lag():
    steps = [
        bench.step_figures(_record(w, 0.5, 0.1, 0.2, 0.1, lag), 2)
        for w, lag in [(1.0, 0), (3.0, 1), (2.0, 1)]
    ]
    s = bench.summarise(steps)
    assert s["step_s"] == 2.0 and s["process_s_per_step"] == 4.0
    assert s["version_lag_max"] == 1 and s["steps_measured"] == 3
    assert s["step_s_mean"] == 2.0 and s["generation_s_mean"] == 0.5


def test_warmup_must_leave_steps(capsys):
    with pytest.raises(SystemExit, match="must exceed"):
        bench.main(["--steps", "2", "--warmup", "2"])


def test_tail_modes_differ_only_in_what_they_compare():
    from types import SimpleNamespace as NS

    modes = bench.tail_modes(NS(tail_share=0.125, tail_short=4, tail_long=64, tail_oversample=1.5))
    assert list(modes) == ["tail_sync", "tail_oversample", "tail_partial", "tail_async_partial"]
    task = {"data.tail_share=0.125", "data.short_answer_tokens=4", "rollout.max_new_tokens=64"}
    assert all(task <= set(m) for m in modes.values())
    assert "rollout.oversample=1.5" not in modes["tail_sync"]
    assert (
        "rollout.partial=true" in modes["tail_partial"]
        and "rollout.partial=true" not in modes["tail_oversample"]
    )
    figures = {"generation_s_mean": 1.0, "generation_tail_share_mean": 0.5, "step_s_mean": 2.0}
    half = {"generation_s_mean": 0.5, "generation_tail_share_mean": 0.1, "step_s_mean": 1.0}
    ratios = bench.tail_comparison(
        {"tail_sync": figures, "tail_oversample": half, "tail_partial": half, "tail_async_partial": figures}
    )
    assert ratios["tail_partial"] == {
        "generation_s_mean_vs_sync": 0.5,
        "generation_tail_share_mean_vs_sync": 0.2,
        "step_s_mean_vs_sync": 0.5,
    }
    assert ratios["tail_async_partial"]["step_s_mean_vs_sync"] == 1.0
