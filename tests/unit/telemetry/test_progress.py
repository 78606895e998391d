"""The progress bar: reward and the share of completions that ended at a stop id, per step."""

from __future__ import annotations

import io

from megatron_rl.telemetry.sinks import Progress


def test_progress_bar_shows_the_stop_fraction():
    out = io.StringIO()
    bar = Progress(total=2, file=out)
    bar.step({"reward": {"mean": 0.25}, "stop_fraction": 0.75})
    assert "grpo reward=0.250 stop=0.75" in bar.bar.desc
    bar.step({"reward": {"mean": 0.5}})  # an older record: reward alone
    assert "reward=0.500" in bar.bar.desc and "stop=" not in bar.bar.desc
    bar.close()


def test_progress_bar_shows_the_gradient_norm_and_the_two_main_statuses():
    bar = Progress(total=2, file=io.StringIO())
    bar.step({"reward": {"mean": 0.0, "statuses": {"no_code": 16}}, "train": {"grad_norm": 0.0}})
    assert bar.bar.desc.rstrip(": ") == "grpo reward=0.000 gnorm=0 no_code=100%"
    statuses = {"failed": 10, "passed": 5, "timeout": 1}
    bar.step(
        {"reward": {"mean": 0.3, "statuses": statuses}, "train": {"grad_norm": 0.8312}, "stop_fraction": 1.0}
    )
    assert bar.bar.desc.rstrip(": ") == "grpo reward=0.300 gnorm=0.831 stop=1.00 failed=62% passed=31%"
    bar.close()
