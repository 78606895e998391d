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
