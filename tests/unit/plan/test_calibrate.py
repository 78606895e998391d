"""--from-steps: read step records, replace assumed phase times, answer "what if we separate"."""

from __future__ import annotations

import json
import re

import pytest

from megatron_rl.cli.plan import main
from megatron_rl.plan.calibrate import calibrate, read_steps, summarize
from megatron_rl.plan.cycle import cycle
from megatron_rl.plan.inputs import PlanError
from megatron_rl.plan.report import build_report
from megatron_rl.plan.search import compare_splits

from .hand import REFERENCE


def _step(step: int, **seconds) -> dict:
    return {"step": step, "phases": {k: {"seconds": v, "mem_gib": 50.0 + step} for k, v in seconds.items()}}


STEPS = [
    _step(
        0,
        init=240.0,
        generation=150.0,
        scoring=10.0,
        old_logprobs=12.0,
        ref_logprobs=12.0,
        train_fwd_bwd=40.0,
        optimizer=2.0,
        publish=5.0,
    ),
    _step(
        1,
        generation=160.0,
        scoring=9.0,
        old_logprobs=11.0,
        ref_logprobs=11.0,
        train_fwd_bwd=38.0,
        optimizer=2.0,
        publish=4.0,
        advantages=0.5,
    ),
    _step(
        2,
        generation=155.0,
        scoring=8.0,
        old_logprobs=11.5,
        ref_logprobs=11.5,
        train_fwd_bwd=39.0,
        optimizer=2.0,
        publish=4.5,
    ),
]
MEDIANS = {
    "generation": 155.0,
    "scoring": 9.0,
    "old_logprobs": 11.5,
    "ref_logprobs": 11.5,
    "train_fwd_bwd": 39.0,
    "optimizer": 2.0,
    "publish": 4.5,
    "other": 0.5,
}


@pytest.fixture
def steps_file(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(json.dumps(s) for s in STEPS) + "\n")
    return path


def test_summarize_takes_medians_and_keeps_init_apart(steps_file):
    s = summarize(read_steps(steps_file))
    assert s["steps"] == 3
    assert s["init_s"] == 240.0
    assert s["median_s"] == MEDIANS  # an unknown phase (advantages) is counted as `other`
    assert s["mem_gib_max"]["generation"] == 52.0


def test_measured_phases_replace_the_assumed_ones(ref, steps_file):
    inp, layout = ref
    predicted = cycle(inp, layout)
    cal = calibrate(inp, layout, predicted, summarize(read_steps(steps_file)))
    assert cal["cycle"].serial_s == pytest.approx(sum(MEDIANS.values()))
    assert cal["factors"]["generation"] == pytest.approx(155.0 / predicted.phases["generation"])
    assert cal["offsets"]["publish"] == pytest.approx(4.5 - predicted.phases["publish"])
    report = build_report(inp, layout, calibration=cal, with_search=False)
    assert report.seconds.serial_cycle == pytest.approx(sum(MEDIANS.values()))
    assert report.seconds.phases["generation"] == 155.0
    assert report.to_json()["seconds"]["generation"] == 155.0  # phases sit beside the other seconds
    assert report.reliability.startup_s == 240.0  # the measured init replaces the assumed start-up
    assert report.calibration is not None and report.calibration.steps == 3


def test_what_if_separated_scales_each_phase_by_its_calibration(ref, steps_file):
    inp, layout = ref
    predicted = cycle(inp, layout)
    cal = calibrate(inp, layout, predicted, summarize(read_steps(steps_file)))
    sep = [c for c in cal["what_if"] if not c.layout.colocated]
    assert sep
    pred_rows = {c.layout: c for c in compare_splits(inp, layout)}
    row = sep[0]
    pred = pred_rows[row.layout]
    assert row.phases["train_fwd_bwd"] == pytest.approx(
        pred.phases["train_fwd_bwd"] * 39.0 / predicted.phases["train_fwd_bwd"]
    )
    assert row.phases["publish"] == pytest.approx(pred.phases["publish"] + cal["offsets"]["publish"])
    assert row.phases["other"] == 0.5
    assert "switch" not in row.phases


def test_scoring_is_calibrated_on_the_pools_whole_time_after_generation(ref, tmp_path):
    """A synchronous step that defers its rewards waits only for what its reward-free forwards leave
    (here 9 s of a 31 s tail): the same pools run asynchronously wait for the whole 31 s, so the
    calibrated what-if rows scale the whole time after generation, and a serial row's wait is that less
    its own calibrated forwards."""
    inp, layout = ref
    assert inp.work.defer_scoring
    tails = (30.0, 31.0, 32.0)
    path = tmp_path / "steps.jsonl"
    recs = [{**s, "scoring": {"after_generation_s": t, "exposed_s": 9.0}} for s, t in zip(STEPS, tails)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = summarize(read_steps(path))
    assert summary["scoring_after_s"] == 31.0
    predicted = cycle(inp, layout)
    cal = calibrate(inp, layout, predicted, summary)
    whole = 31.0 / (predicted.phases["scoring"] + predicted.scoring["behind_forwards_s"])
    assert cal["factors"]["scoring_after_generation"] == pytest.approx(whole)
    assert "scoring" not in cal["factors"]  # the exposed phase is derived, not scaled
    assert cal["measured_s"]["scoring_after_generation"] == 31.0
    assert cal["cycle"].phases["scoring"] == 9.0  # the measured cycle keeps what it waited
    pred_rows = {c.layout: c for c in compare_splits(inp, layout)}
    seen = set()
    for row in cal["what_if"]:
        pred = pred_rows[row.layout]
        full = (pred.phases["scoring"] + pred.scoring.get("behind_forwards_s", 0.0)) * whole
        if row.layout.overlapped:
            assert row.phases["scoring"] == pytest.approx(full)
        else:
            covered = row.phases["old_logprobs"] + row.phases["ref_logprobs"]
            assert row.phases["scoring"] == pytest.approx(max(0.0, full - covered))
        seen.add(row.layout.overlapped)
    assert seen == {True, False}
    asynchronous = [r for r in cal["what_if"] if r.layout.overlapped]
    assert all(r.phases["scoring"] > 25.0 for r in asynchronous)  # not the 9 s a sync step waited
    # one record without the key: the whole is not known for every step, so the phase's ratio is used
    path.write_text("".join(json.dumps(r) + "\n" for r in [*recs[:2], STEPS[2]]))
    assert summarize(read_steps(path))["scoring_after_s"] is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"step": 1, "phases": {}, "scoring": {"after_generation_s": -2}}',
            '"scoring" needs a non-negative',
        ),
        ('{"step": 1, "phases": {}, "scoring": 3}', '"scoring" needs a non-negative'),
        ("{not json", "steps.jsonl:2: not JSON"),
        ('{"phases": {}}', 'steps.jsonl:2: each line must be an object with an integer "step"'),
        ('{"step": 1, "phases": []}', '"phases" must be an object'),
        ('{"step": 1, "phases": {"generation": {"seconds": -1}}}', "phase 'generation' needs a non-negative"),
    ],
)
def test_malformed_records_fail_with_the_line(tmp_path, line, message):
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps(STEPS[0]) + "\n" + line + "\n")
    with pytest.raises(PlanError, match=re.escape(message)):
        read_steps(path)


def test_cli_from_steps(steps_file, capsys):
    assert main([REFERENCE, "--from-steps", str(steps_file), "--no-search"]) == 0
    out = capsys.readouterr().out
    assert "calibrated with measured steps" in out and "Calibration from 3 measured steps" in out
    assert main([REFERENCE, "--from-steps", str(steps_file) + ".missing", "--no-search"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_phase_some_steps_skip_counts_zero_there():
    """With algorithm.old_logprobs=auto most steps have no old-policy forward: the median per step is
    0, not the seconds of the few steps that ran one."""
    recs = [{"phases": {"generation": {"seconds": 1.0}, "old_logprobs": {"seconds": 0.5}}}]
    recs += [{"phases": {"generation": {"seconds": 1.0}}} for _ in range(4)]
    assert summarize(recs)["median_s"]["old_logprobs"] == 0.0
    assert "ref_logprobs" not in summarize(recs)["median_s"]  # never measured: left to the model
