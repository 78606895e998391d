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


def test_warmup_must_leave_steps(capsys):
    with pytest.raises(SystemExit, match="must exceed"):
        bench.main(["--steps", "2", "--warmup", "2"])
