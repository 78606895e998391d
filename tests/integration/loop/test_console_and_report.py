"""A quiet terminal and `megatron-rl report` on runs of the tiny recipe (real trainer, engines, sandbox).

Run A (conftest.py's `tiny_run`: 3 steps, quiet, progress bar on) is what `make demo` looks like; run B
(`verbose_oversampled_run`: 2 steps, no KL, so no reference phase) runs with MEGATRON_RL_VERBOSE=1 and
shows what the quiet terminal keeps out: the same line budget that A passes fails there.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rl.telemetry.phases import PHASES
from tests.helpers.launch import REPO
from tests.helpers.tiny_run import TINY_STEPS, VERBOSE_STEPS, launch

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
BUDGET = 60
BAR = re.compile(r"\|\s*\d+/\d+ \[")  # a tqdm redraw: "...| 2/3 [00:04<00:02, ..."


def console_lines(text: str) -> list[str]:
    """Terminal lines without the progress bar's redraws (it redraws in place with \\r)."""
    out = []
    for line in text.splitlines():
        kept = [seg for seg in line.split("\r") if seg.strip() and not BAR.search(seg)]
        out += kept
    return out


@pytest.fixture(scope="module")
def runs(tiny_run, verbose_oversampled_run):
    """Run A's folder and run B's: <folder>/<name>.log is the terminal, <folder>/outputs/<name> the run."""
    return tiny_run[0] / "tiny", verbose_oversampled_run[0] / "verbose"


def _terminal(run: Path) -> str:
    return (run.parent / f"{run.name}.log").read_text()


def _outputs(run: Path) -> Path:
    return run.parent / "outputs" / run.name


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron_rl.cli", "report", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_quiet_terminal_fits_the_line_budget_and_keeps_what_matters(runs):
    quiet, _ = runs
    text = _terminal(quiet)
    lines = console_lines(text)
    assert len(lines) <= BUDGET, "\n".join(lines)
    assert lines[0].startswith("megatron-rl train grpo_tiny_cpu"), lines[:3]
    assert any(str(_outputs(quiet)) in line for line in lines[:5]), lines[:5]
    assert any(line.startswith("reward: ") and line.endswith(", over 3 steps") for line in lines)
    statuses = next(line for line in lines if line.startswith("statuses: "))
    assert "grad norm " in statuses and "%" in statuses, statuses
    assert any(line.lstrip().startswith("generation") for line in lines), "no per-phase table"
    assert "grpo reward=" in text and "gnorm=" in text, "the progress bar is gone"
    # W&B offline (WANDB_MODE=offline): said at the start and at the end, with the command that uploads it
    sync = f"wandb sync {_outputs(quiet) / 'wandb'}"
    assert any(
        line.startswith("W&B run ") and line.endswith(f"upload it later with: {sync}") for line in lines
    )
    assert lines[-1] == f"W&B ran offline; upload it with: {sync}"
    for noise in ("Transformer Engine", "DistributedDataParallelConfig", "non-default args", "Traceback"):
        assert noise not in text, noise


def test_samples_to_read_in_samples_jsonl_and_a_wandb_table(runs):
    """logger.samples_per_step (4) completions per step, decoded, with their reward and status."""
    from megatron_rl.reward.result import STATUSES

    run = _outputs(runs[0])
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4 + [3] * 4
    assert [r["prompt_index"] for r in rows[:4]] == [0, 1, 2, 3], "one per group: 4 prompts x 4 samples"
    for r in rows:
        assert r["prompt"].startswith("<bos>") and r["prompt"].endswith("=") and r["status"] in STATUSES
        assert 0.0 <= r["reward"] <= 1.0 and r["completion_tokens"] > 0 and r["completion"]
    tables = list(run.rglob("samples_*.table.json"))
    assert len(tables) == 3, "a W&B table per step"
    assert json.loads(tables[0].read_text())["columns"][-2:] == ["prompt", "completion"]


def test_log_txt_holds_every_rank_prefixed(runs):
    log = (_outputs(runs[0]) / "log.txt").read_text()
    assert "[rank0] " in log and "[rank1] " in log
    assert all(line.startswith("[rank") for line in log.splitlines() if line)
    assert "Transformer Engine" in log, "third-party warnings belong in log.txt"


def test_no_chat_template_warmup(runs):
    for run in runs:
        assert "Chat template warmup" not in (_outputs(run) / "log.txt").read_text()


def test_verbose_restores_everything_on_the_terminal(runs):
    lines = console_lines(_terminal(runs[1]))
    assert len(lines) > BUDGET, "verbose shows the third-party output the quiet terminal keeps out"
    assert any("Transformer Engine" in line for line in lines)


def test_report_json_has_every_section(runs):
    done = _report(str(_outputs(runs[0])), "--json")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert rep["steps"] == TINY_STEPS == 3 and rep["ranks"] == 2
    assert set(rep["phases"]) == set(PHASES)
    gen = rep["phases"]["generation"]
    assert set(gen["seconds"]) == {"mean", "p50", "max"} and gen["seconds"]["max"] > 0
    assert gen["mem_gib"]["max"] > 0.1 and 0 < gen["share"] < 1
    # The first step (the engines' warm-up) is reported apart and left out of the steady statistics: the
    # figures are the records' own (a timing comparison between steps would be noise on 2 cores).
    recs = [json.loads(x) for x in (_outputs(runs[0]) / "steps.jsonl").read_text().splitlines() if x]
    gen_s = [r["phases"]["generation"]["seconds"] for r in recs]
    assert gen["first_step_s"] == pytest.approx(gen_s[0]) and gen["seconds"]["max"] == pytest.approx(
        max(gen_s[1:])
    )
    assert set(rep["idle"]) == {"longest_completion", "reward_pool", "switch", "publication", "environments"}
    assert all(v["seconds_per_step"] is not None for v in rep["idle"].values())
    assert rep["idle"]["environments"]["seconds_per_step"] == 0.0  # single-turn: no environment to wait on
    assert rep["turns"] is None
    t = rep["throughput"]
    assert t["generated_tokens_per_s"] > 0 and t["trained_tokens_per_s"] > 0 and 0 < t["mfu"] < 1
    assert set(rep["trends"]) == {
        "reward",
        "grad norm",
        "flat groups",
        "KL",
        "log-prob agreement |d|",
        "stop fraction",
    }
    assert len(rep["trends"]["reward"]["series"]) == 3
    assert all(g > 0 for g in rep["trends"]["grad norm"]["series"]), "the tiny run learns: gradients"
    assert sum(rep["statuses"]["run"].values()) == pytest.approx(1.0) and rep["no_signal"] is None
    text = _report(str(_outputs(runs[0]))).stdout
    assert re.search(r"^statuses: \w+ \d", text, re.M) and "grad norm" in text, text


def test_report_trace_is_chrome_trace_with_every_rank(runs, tmp_path):
    trace = tmp_path / "trace.json"
    done = _report(str(_outputs(runs[0])), "--trace", str(trace))
    assert done.returncode == 0, done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1}
    for e in spans:
        assert e["name"] in PHASES and e["ts"] >= 0 and e["dur"] >= 0 and e["args"]["step"] in (1, 2, 3)
    for rank in (0, 1):
        for step in (1, 2, 3):
            names = {e["name"] for e in spans if e["tid"] == rank and e["args"]["step"] == step}
            assert {"generation", "train_fwd_bwd", "publish"} <= names, (rank, step, names)


def test_report_plot_and_timeline_are_pngs(runs, tmp_path):
    png = tmp_path / "report.png"
    done = _report(str(_outputs(runs[0])), "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert (_outputs(runs[0]) / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    blobs = [f.read_bytes() for f in _outputs(runs[0]).rglob("run-*.wandb")]
    assert blobs and any(b"figures/timeline" in blob for blob in blobs), "W&B gets the timeline too"


def test_compare_puts_two_runs_side_by_side(runs):
    a, b = _outputs(runs[0]), _outputs(runs[1])
    done = _report(str(a), "--compare", str(b))
    assert done.returncode == 0, done.stderr
    assert (TINY_STEPS, VERBOSE_STEPS) == (3, 2)
    assert "(3 steps)" in done.stdout and "(2 steps)" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.strip().startswith("generation "))
    assert len(row.split()) == 4, row
    # Run B has no reference model: its ref_logprobs row is absent or empty, A's is not.
    done_json = _report(str(a), "--compare", str(b), "--json")
    both = json.loads(done_json.stdout)
    assert both["A"]["phases"]["ref_logprobs"]["seconds"]["p50"] > 0
    assert both["B"]["phases"]["ref_logprobs"]["seconds"]["p50"] == 0


def test_plan_from_steps_prints_measured_next_to_predicted(runs):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_rl.cli",
            "plan",
            "grpo_tiny_cpu",
            "--no-search",
            "--from-steps",
            str(_outputs(runs[0]) / "steps.jsonl"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("Calibration from") :]
    assert "measured" in table and "predicted" in table
    assert re.search(r"generation\s+[\d.]+\s+[\d.]+", table), table


def test_a_failing_run_shows_its_error_briefly(tmp_path):
    """An error after the console took over fds 1 and 2 still reaches the terminal, without torchrun's
    traceback: each rank's message, one line per failed rank, and the end of log.txt. The error is one the
    recipe check cannot see: a checkpoint folder that exists but does not verify, found at start-up."""
    bad = tmp_path / "not_a_checkpoint"
    bad.mkdir()
    proc = launch(tmp_path, 1, [f"checkpoint.resume={bad}"], name="failing", wait=False)
    assert proc.wait(timeout=600) != 0
    text = (tmp_path / "failing.log").read_text()
    lines = console_lines(text)
    assert "ended with exit code 1" in text and "run failed; the last" in text
    summary = next(i for i, line in enumerate(lines) if "ended with exit code" in line)
    # The ranks' own messages, before torchrun's summary and the log tail (which quotes log.txt, indented).
    assert any(str(bad) in line and not line.startswith(" ") for line in lines[:summary]), text
    assert "Traceback" not in text and "ChildFailedError" not in text
    assert len(lines) < 26, text  # header 5, a warning, 3 per rank, torchrun 4, the log tail 9
