"""`megatron-rl report` on hand-made step records whose every figure can be worked out by hand."""

import json

import pytest

from megatron_rl.cli.report import main
from megatron_rl.loop.record.records import switch_seconds
from megatron_rl.loop.record.summary import generation_tail_seconds
from megatron_rl.telemetry.phases import PHASES
from megatron_rl.telemetry.report import ReportError, load_records, phase_table, summarize
from megatron_rl.telemetry.trace import load_spans, trace_events


def _rec(step: int, gen: float, train: float, init: float = 0.0, reward: float = 0.5) -> dict:
    secs = {
        "init": init,
        "generation": gen,
        "scoring": 1.0,
        "train_fwd_bwd": train,
        "optimizer": 0.5,
        "publish": 0.5,
    }
    phases = {
        p: {
            "seconds": secs.get(p, 0.0),
            "mem_gib": 2.0 + i + step / 10,
            "seconds_by_rank": [secs.get(p, 0.0)] * 2,
        }
        for i, p in enumerate(PHASES)
    }
    t = 1000.0 + 100 * step
    return {
        "step": step,
        "phases": phases,
        "reward": {"mean": reward},
        "train": {"kl": 0.01 * step},
        "logprob_agreement": {"mean_abs_diff": 1e-6},
        "stop_fraction": 0.75,
        "tokens": {"generated": 1000, "trained": 1500},
        "generation": {"tail_s": gen / 4},
        "switch_seconds": 0.25,
        "flops": {"trainer": 4e12, "peak_per_device": 1e12},
        "spans_by_rank": [
            [["generation", t, t + gen], ["train_fwd_bwd", t + gen + 1, t + gen + 1 + train]],
            [["generation", t, t + gen + 0.5]],
        ],
    }


# Step 1: warm-up (generation 30 s) after 20 s of start-up; steps 2-4 steady.
RECORDS = [
    _rec(1, 30.0, 2.0, init=20.0, reward=0.2),
    _rec(2, 4.0, 2.0),
    _rec(3, 6.0, 3.0),
    _rec(4, 8.0, 1.0, reward=0.8),
]


def test_phase_statistics_skip_the_warm_up_step_and_show_it_apart():
    s = summarize(RECORDS)
    gen = s["phases"]["generation"]
    assert gen["seconds"] == {"mean": 6.0, "p50": 6.0, "max": 8.0}
    assert gen["first_step_s"] == 30.0
    assert s["phases"]["init"]["seconds"]["max"] == 20.0 and s["phases"]["init"]["share"] is None
    # Steady steps: 4+1+2+.5+.5 = 8, 6+1+3+.5+.5 = 11, 8+1+1+.5+.5 = 11 -> 30 s in all.
    assert s["step"]["mean"] == pytest.approx(10.0) and s["step"]["first_step_s"] == pytest.approx(34.0)
    assert gen["share"] == pytest.approx(18 / 30)
    assert sum(p["share"] for n, p in s["phases"].items() if n != "init") == pytest.approx(1.0)
    assert gen["mem_gib"]["max"] == pytest.approx(2.0 + 1 + 0.4), "peak over the steady steps"


def test_idle_throughput_and_mfu():
    s = summarize(RECORDS)
    idle = s["idle"]
    assert idle["longest_completion"]["seconds_per_step"] == pytest.approx(1.5)  # (1 + 1.5 + 2) / 3
    assert idle["longest_completion"]["share"] == pytest.approx(4.5 / 30)
    assert idle["reward_pool"]["seconds_per_step"] == 1.0 and idle["switch"]["seconds_per_step"] == 0.25
    t = s["throughput"]
    assert t["generated_tokens_per_s"] == pytest.approx(3000 / 18)
    assert t["trained_tokens_per_s"] == pytest.approx(4500 / (6 + 1.5))
    # 3 steps x 4e12 FLOPs over 30 s on 2 devices of 1e12 FLOP/s.
    assert t["mfu"] == pytest.approx(12e12 / (30 * 2 * 1e12))


def test_mfu_is_unknown_without_a_device_peak():
    recs = [{**r, "flops": {"trainer": 4e12, "peak_per_device": None}} for r in RECORDS]
    assert summarize(recs)["throughput"]["mfu"] is None


def test_trends_compare_first_and_last_windows():
    s = summarize(RECORDS)
    assert s["trends"]["reward"]["first"] == pytest.approx(0.35)  # window 2: steps 1-2
    assert s["trends"]["reward"]["last"] == pytest.approx(0.65)
    assert s["trends"]["stop fraction"]["series"] == [0.75] * 4
    older = [
        {k: v for k, v in r.items() if k != "stop_fraction"} | {"tokens": {"truncated_fraction": 0.1}}
        for r in RECORDS
    ]
    assert summarize(older)["trends"]["stop fraction"]["first"] == pytest.approx(0.9)


def test_phase_table_lists_the_phases_that_ran():
    text = phase_table(RECORDS)
    assert "steps 2-4; step 1 (warm-up) apart" in text
    assert "ref_logprobs" not in text and "generation" in text and "init" in text
    assert "waiting on the longest completion 1.50 s (15.0%)" in text


def test_trace_has_one_track_per_rank_and_complete_events():
    trace = trace_events(RECORDS)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 4 * 3
    assert {e["tid"] for e in spans} == {0, 1}
    first = min(spans, key=lambda e: e["ts"])
    assert first["ts"] == 0 and first["args"]["step"] == 1
    slow = next(e for e in spans if e["tid"] == 1 and e["args"]["step"] == 2)
    assert slow["dur"] == pytest.approx(4.5e6)
    names = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert [n["args"]["name"] for n in names] == ["rank 0", "rank 1"]


def test_trace_refuses_records_without_spans():
    with pytest.raises(ValueError, match="spans_by_rank"):
        trace_events([{k: v for k, v in r.items() if k != "spans_by_rank"} for r in RECORDS])


def _write(tmp_path, name: str, records: list[dict]):
    run = tmp_path / name
    run.mkdir()
    (run / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_a_resumed_run_keeps_the_last_record_of_each_step(tmp_path):
    again = {**RECORDS[1], "reward": {"mean": 0.9}}
    run = _write(tmp_path, "r", [*RECORDS[:3], again, RECORDS[3]])
    recs = load_records(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and recs[1]["reward"]["mean"] == 0.9


def test_bad_inputs_say_what_is_wrong(tmp_path, capsys):
    with pytest.raises(ReportError, match="no steps.jsonl"):
        load_records(tmp_path)
    (tmp_path / "steps.jsonl").write_text('{"step": 1, "phases": {}}\nnot json\n{"step": 2, "phases": {}}\n')
    with pytest.raises(ReportError, match=r"steps.jsonl:2: not JSON"):
        load_records(tmp_path)
    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("megatron-rl report: ") and "Traceback" not in err


def test_cli_text_json_compare_trace_and_plot(tmp_path, capsys):
    a = _write(tmp_path, "a", RECORDS)
    b = _write(tmp_path, "b", [_rec(s, g / 2, t) for s, g, t in ((1, 30, 2), (2, 2, 2), (3, 3, 3))])
    assert main([str(a)]) == 0
    out = capsys.readouterr().out
    assert "throughput:" in out and "MFU 20.0%" in out and "reward" in out
    assert main([str(a), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    assert main([str(a), "--compare", str(b)]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("generation"))
    assert row == ["generation", "6.00", "1.25", "x0.21"]
    trace, png = tmp_path / "t.json", tmp_path / "r.png"
    assert main([str(a), "--trace", str(trace), "--plot", str(png)]) == 0
    assert json.loads(trace.read_text())["traceEvents"] and png.read_bytes()[:4] == b"\x89PNG"


def test_a_truncated_last_line_is_skipped_with_a_warning(tmp_path, capsys, caplog):
    """What a run killed mid-write leaves: the steps before it are still reported."""
    run = _write(tmp_path, "killed", RECORDS)
    with (run / "steps.jsonl").open("a") as f:
        f.write(json.dumps(RECORDS[0])[:40])
    with caplog.at_level("WARNING"):
        assert [r["step"] for r in load_records(run)] == [1, 2, 3, 4]
    assert "steps.jsonl:5: skipping a truncated last line" in caplog.text
    assert main([str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4


def test_trace_reads_the_spans_file_next_to_the_steps(tmp_path, capsys):
    """The loop writes spans.jsonl apart from steps.jsonl (whose records stay max-over-ranks)."""
    run = _write(tmp_path, "r", [{k: v for k, v in r.items() if k != "spans_by_rank"} for r in RECORDS])
    lines = [json.dumps({"step": r["step"], "spans_by_rank": r["spans_by_rank"]}) for r in RECORDS]
    (run / "spans.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:25])  # a truncated last line too
    assert sorted(load_spans(run)) == [1, 2, 3, 4]
    trace = tmp_path / "t.json"
    assert main([str(run), "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["ph"] == "X"} == {0, 1}
    assert trace_events(load_records(run), load_spans(run))["traceEvents"] == events


@pytest.mark.parametrize("flag", ["--trace", "--plot"])
def test_an_unwritable_output_is_one_line_and_exit_2(tmp_path, capsys, flag):
    run = _write(tmp_path, "r", RECORDS)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([str(run), flag, str(blocker / "sub" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("megatron-rl report: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "a-file" in err, err


def test_generation_tail_and_switch_seconds():
    # Four samples finishing at 1, 1, 1 and 9 s of a 9 s call: the batch ran 3/4 empty for 8 s.
    assert generation_tail_seconds([1.0, 1.0, 1.0, 9.0], 9.0) == pytest.approx(6.0)
    assert generation_tail_seconds([9.0, 9.0], 9.0) == 0.0, "everyone runs to the end: nothing waits"
    assert generation_tail_seconds([], 3.0) == 0.0
    times = {"train_end": 0.0, "trainer_offloaded": 0.5, "published": 2.0, "rollout_start": 2.25}
    assert switch_seconds(times) == pytest.approx(0.75), "publication itself is not a switch"
    assert switch_seconds({**times, "rollout_end": 5.0, "train_start": 6.0}) == pytest.approx(1.75)


def test_overlapped_steps_show_their_wall_clock_beside_the_summed_phases():
    """Separated and asynchronous, the engines' phases run while the trainer's do: the table adds the
    wall clock per step, and end-to-end throughput is over it. Serial steps (wall ~ sum) add nothing."""
    from megatron_rl.telemetry.report import phase_table, summarize

    serial = [_rec(s, 2.0, 3.0) for s in range(1, 5)]
    for r in serial:
        r["wall_seconds"] = r["step_seconds"] if "step_seconds" in r else 7.0
    assert "wall (overlap)" not in phase_table(serial)
    overlapped = [_rec(s, 2.0, 3.0) for s in range(1, 5)]
    for r in overlapped:
        r["wall_seconds"] = 4.0  # max(generation + scoring, training) + publish, not their sum (7 s)
    s = summarize(overlapped)
    assert s["wall"]["p50"] == 4.0 and s["step"]["p50"] == 7.0
    assert "wall (overlap)" in phase_table(overlapped)
    assert s["throughput"]["end_to_end_tokens_per_s"] == pytest.approx(
        summarize(serial)["throughput"]["end_to_end_tokens_per_s"] * 7.0 / 4.0
    )
