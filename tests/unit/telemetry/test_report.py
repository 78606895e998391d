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


def _learning(rec: dict, statuses: dict, grad_norm: float, flat: float) -> dict:
    reward = {
        **rec["reward"],
        "max": rec["reward"]["mean"],
        "statuses": statuses,
        "flat_group_fraction": flat,
    }
    return {**rec, "reward": reward, "train": {**rec["train"], "grad_norm": grad_norm}}


def test_report_shows_the_statuses_the_gradient_norm_and_a_run_that_cannot_learn(tmp_path, capsys):
    """Issue 36's run: 16 samples per step, all no_code, grad norm 0, every group flat."""
    flat = [_learning({**r, "reward": {"mean": 0.0}}, {"no_code": 16}, 0.0, 1.0) for r in RECORDS]
    s = summarize(flat)
    assert s["statuses"]["first"] == s["statuses"]["last"] == {"no_code": 1.0}
    assert s["trends"]["grad norm"]["series"] == [0.0] * 4 and s["trends"]["flat groups"]["last"] == 1.0
    run = _write(tmp_path, "flat", flat)
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "statuses: no_code 100% -> 100%; grad norm 0 -> 0" in out
    assert "  grad norm " in out and "  flat groups " in out
    assert "no learning signal for 4 steps in a row (steps 1-4): every reward was 0" in out
    assert "likely cause: 100% no_code: the completions hold no code block" in out
    assert main([str(run), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["no_signal"]["steps"] == [1, 4] and "100% no_code" in rep["no_signal"]["line"]
    assert rep["statuses"]["run"] == {"no_code": 1.0} and rep["windows"] == {
        "size": 2,
        "first": [1, 2],
        "last": [3, 4],
    }
    # The run's own logger.no_signal_steps, from the recipe.json beside its records: 5 > 4 steps, silent.
    (run / "recipe.json").write_text(json.dumps({"logger": {"no_signal_steps": 5}}))
    assert main([str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["no_signal"] is None


def test_a_learning_run_shows_its_statuses_move_and_no_warning(tmp_path, capsys):
    moving = [
        _learning(RECORDS[0], {"failed": 12, "no_code": 4}, 0.8, 0.25),
        _learning(RECORDS[1], {"failed": 10, "passed": 6}, 0.6, 0.0),
        _learning(RECORDS[2], {"failed": 8, "passed": 8}, 0.5, 0.0),
        _learning(RECORDS[3], {"passed": 15, "timeout": 1}, 0.3, 0.5),
    ]
    run = _write(tmp_path, "moving", moving)
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    # steps 1-2: 22 failed, 6 passed, 4 no_code of 32; steps 3-4: 8 failed, 23 passed, 1 timeout
    assert "statuses: failed 69% -> 25%, passed 19% -> 72%, no_code 12% -> 0%, timeout 0% -> 3%; " in out
    assert "grad norm 0.7 -> 0.4" in out and "no learning signal" not in out


def test_the_closing_lines_of_a_run_and_of_a_resumed_one():
    from megatron_rl.telemetry.report import closing_lines

    text = closing_lines([_learning(r, {"failed": 16}, 0.5, 0.0) for r in RECORDS])
    assert text.startswith(
        "reward: 0.3500 (steps 1-2) -> 0.6500 (steps 3-4), x1.86, over 4 steps\n"
        "statuses: failed 100% -> 100%; grad norm 0.5 -> 0.5\n"
    )
    # A run resumed at step 3 that ran steps 4 and 5: its table's first column is its own first step's.
    resumed = [_learning({**r, "step": s}, {"failed": 16}, 0.5, 0.0) for r, s in zip(RECORDS, (4, 5))]
    text = closing_lines(resumed)
    assert text.startswith("reward: 0.2000 (step 4) -> 0.5000 (step 5), x2.50, over 2 steps\n")
    assert "per phase, seconds of the slowest rank (step 5; step 4 (warm-up) apart):" in text
    assert "step 4 s" in text and "step 1 s" not in text and "steps 5-5" not in text
    one = closing_lines(resumed[:1])
    assert one.startswith("reward: 0.2000 (step 4), over 1 step\nstatuses: failed 100%; grad norm 0.5\n")


def test_the_report_of_one_resumed_step_and_of_older_records_reads_right():
    """One step (a resume that ran step 4 alone): "1 step", its trends as values, not "0.2 -> 0.2"; the
    phase table's first-step column named after step 4. Older records (no statuses, no gradient norm):
    no empty statuses line."""
    from megatron_rl.telemetry.report import render

    one = render(summarize([_learning({**RECORDS[0], "step": 4}, {"failed": 16}, 0.5, 0.0)]), "r")
    assert one.startswith("run r: 1 step, 2 ranks\nper phase, seconds of the slowest rank (step 4 only):\n")
    assert "  phase " in one and " step 4 s " in one and "step 1 s" not in one
    assert "trends (step 4 only):\n  reward                   0.2\n" in one and " -> " not in one
    assert "statuses: failed 100%; grad norm 0.5\n" in one
    older = render(summarize(RECORDS), "r")
    assert "run r: 4 steps, 2 ranks" in older and "trends (mean of steps 1-2 -> steps 3-4):" in older
    assert "statuses" not in older and "\n\n" not in older.split("throughput")[1]


def test_a_ppo_run_reports_its_critic_with_the_explained_variance_pooled_over_each_window():
    from megatron_rl.telemetry.report import learning_lines

    recs = [_rec(i, 2.0, 1.0) for i in range(1, 21)]
    for r in recs:
        r["value_loss"] = 0.01 if r["step"] <= 10 else 0.002
        # the last window holds one step of near-constant returns: its own ratio is -99, the window's 0.79
        r["returns_variance"], r["residual_variance"] = (0.1, 0.1) if r["step"] <= 10 else (0.1, 0.02)
        r["explained_variance"] = 1 - r["residual_variance"] / r["returns_variance"]
    recs[-1]["returns_variance"], recs[-1]["residual_variance"], recs[-1]["explained_variance"] = (
        1e-4,
        1e-2,
        -99.0,
    )
    lines = learning_lines(summarize(recs))
    assert lines[-1] == "critic: value loss 0.01 -> 0.002, explained variance 0.00 -> 0.79 (pooled)", lines
    assert not any(line.startswith("critic:") for line in learning_lines(summarize(RECORDS)))  # GRPO: none
