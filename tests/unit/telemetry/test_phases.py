"""Phase timing and peak memory per phase, the reduction record, and the sinks' formats."""

import json
import time

import pytest

from megatron_rl.telemetry.phases import PHASES, PhaseTimer, cpu_peak_gib, reduce_over_ranks, reset_cpu_peak
from megatron_rl.telemetry.plots import plot_timeline
from megatron_rl.telemetry.sinks import JsonlWriter, flatten


def test_peak_is_reset_per_phase():
    if not reset_cpu_peak():
        pytest.skip("this kernel does not allow resetting VmHWM")
    timer = PhaseTimer(cuda=False)
    with timer.phase("generation"):
        blob = bytearray(300 * 2**20)  # +300 MiB resident
        blob[::4096] = b"x" * len(blob[::4096])
    del blob
    with timer.phase("scoring"):
        time.sleep(0.01)
    stats = timer.take()
    assert stats["generation"].mem_gib - stats["scoring"].mem_gib > 0.2, (
        "the second phase kept the first's peak"
    )
    assert stats["scoring"].seconds >= 0.01 and timer.take() == {}
    assert cpu_peak_gib() > 0


def test_reduce_without_a_process_group_keeps_per_rank_lists():
    timer = PhaseTimer(cuda=False)
    with timer.phase("publish"):
        pass
    out = reduce_over_ranks(timer.take(), PHASES)
    assert set(out) == set(PHASES)
    assert out["publish"]["seconds_by_rank"] == [pytest.approx(out["publish"]["seconds"], abs=1e-5)]
    assert out["init"]["seconds"] == 0.0


def test_flatten_jsonl_and_plot(tmp_path):
    rec = {
        "step": 1,
        "reward": {"mean": 0.5, "statuses": {"passed": 2}},
        "phases": {
            p: {"seconds": 0.1 * (i + 1), "mem_gib": 1.0 + i, "reserved_gib": 0.0}
            for i, p in enumerate(PHASES)
        },
    }
    flat = flatten(rec)
    assert flat["reward/mean"] == 0.5 and flat["phases/publish/mem_gib"] == 1.0 + PHASES.index("publish")
    w = JsonlWriter(tmp_path / "steps.jsonl")
    w.write(rec)
    w.close()
    assert json.loads((tmp_path / "steps.jsonl").read_text())["step"] == 1
    png = plot_timeline([rec, {**rec, "step": 2}], tmp_path / "t.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_phase_inside_another_counts_its_own_seconds_only():
    """The probe runs inside the publication: phases still add up to the step, the outer peak covers both."""
    import time

    t = PhaseTimer(cuda=False)
    with t.phase("publish"):
        time.sleep(0.05)
        with t.phase("probe"):
            big = bytearray(64 << 20)  # the inner phase's memory counts in the outer one's peak too
            time.sleep(0.1)
            del big
        time.sleep(0.05)
    s = t.take()
    spans = {name: b - a for name, a, b in t.take_spans()}  # whole intervals, for the trace
    assert s["probe"].seconds == pytest.approx(spans["probe"], abs=2e-4)
    assert s["publish"].seconds + s["probe"].seconds == pytest.approx(spans["publish"], abs=2e-4)
    assert s["publish"].seconds >= 0.1 and s["publish"].mem_gib >= s["probe"].mem_gib > 0
