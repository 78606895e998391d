"""The benchmarks and tools that drive real engines, sandboxes and runs, in smoke mode (tiny sizes, one
repeat), run as a user runs them: each must exit 0 and print its JSON with every figure measured, so a
refactor that breaks one fails the suite. Benchmark numbers are not judged (benchmarks are not timed
tests, DESIGN.md section 8); what each claims about its own output is. The multi-process ones without
engines: tests/dist/test_script_smoke.py. Which test runs each script: tests/unit/test_shipped_scripts.py."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from megatron_rl.reward.sandbox import find_bwrap
from tests.helpers.launch import REPO, torchrun
from tests.helpers.tiny_run import FAST

pytestmark = [pytest.mark.slow]
needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)


def bench(script: str, *args: str, timeout: float = 600, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    cmd = [sys.executable, f"benchmarks/{script}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout, env=env)
    if ok:
        assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def last_json(stdout: str) -> dict:
    """The benchmark's JSON: the last top-level object on stdout (vLLM logs on stdout before it)."""
    return json.loads(stdout[stdout.rindex("\n{") + 1 :] if "\n{" in stdout else stdout)


@pytest.mark.vllm
def test_rollout_benchmark_starts_an_engine_publishes_and_generates():
    out = last_json(
        bench("rollout.py", "--prompts", "2", "--samples", "2", "--tokens", "4", "--iters", "1").stdout
    )
    assert out["device"] == "cpu" and out["batch"] == {"prompts": 2, "samples": 2, "tokens": 4}
    assert out["engine_start_s"] > 0 and out["publish_s"] > 0
    assert out["cold_tokens_per_s"] > 0 and out["warm_tokens_per_s"] > 0
    assert out["memory"]["peak_rss_gib"] > 0


@needs_bwrap
def test_sandbox_benchmark_runs_a_baseline_checkout_in_its_own_process(tmp_path):
    """`--baseline DIR`: DIR's sandbox runs in a process of its own with DIR first on PYTHONPATH (its
    imports are DIR's, not this tree's). The baseline here is a copy of this tree's package; a folder
    without one is refused, naming the package its process imported instead."""
    base = tmp_path / "baseline"
    shutil.copytree(REPO / "megatron_rl", base / "megatron_rl", ignore=shutil.ignore_patterns("__pycache__"))
    out = json.loads(bench("sandbox.py", "--runs", "4", "--workers", "2", "--baseline", str(base)).stdout)
    for how in ("bare", "bare_isolated", "sandboxed"):
        assert out["sequential"][how]["per_s"] > 0 and out["concurrent"][f"{how}_per_s"] > 0, how
    assert out["sequential"]["ratio_vs_bare"] > 0 and out["concurrent"]["workers"] == 2
    side_by_side = out["versus_baseline"]
    for side in ("current", "baseline"):
        assert side_by_side[side]["per_s"] > 0 and side_by_side[side]["per_s_2_workers"] > 0, side
    assert side_by_side["ratio_mean_ms"] > 0 and side_by_side["ratio_per_s"] > 0

    empty = tmp_path / "empty"
    empty.mkdir()
    refused = bench("sandbox.py", "--runs", "1", "--workers", "1", "--baseline", str(empty), ok=False)
    assert refused.returncode != 0
    assert (
        f"--baseline {empty}: its process imported {REPO / 'megatron_rl'}, not that checkout's"
        in refused.stderr
    )


@needs_bwrap
@pytest.mark.vllm
def test_agreement_benchmark_measures_the_probes_cost():
    """The probe's cost: 3 steps with it and 3 without, side by side. (Its fault runs are
    tests/integration/loop/test_agreement_faults.py's runs: that test launches them through it.)"""
    out = json.loads(bench("agreement.py", "--paths", "", "--cost-steps", "3", "--repeats", "1").stdout)
    assert out["runs"] == []
    cost = out["cost"]
    assert cost["recipe"] == "grpo_tiny_cpu" and cost["steps_per_run"] == 3 and cost["repeats"] == 1
    assert set(cost["step_s_median"]) == {"probe", "no_probe"} and all(
        s > 0 for s in cost["step_s_median"].values()
    )
    assert cost["probe_phase_share_median"] > 0


@needs_bwrap
@pytest.mark.vllm
def test_async_benchmark_runs_both_modes_and_the_planner(tmp_path):
    """Two steps of each mode on separated pools (the second measured), then the planner calibrated on the
    synchronous run predicting the asynchronous one."""
    extra = " ".join(FAST)
    args = ["--steps", "2", "--warmup", "1", "--repeats", "1", "--overrides", extra, "--keep", str(tmp_path)]
    out = json.loads(bench("async.py", *args).stdout)
    assert set(out["modes"]) == {"sync", "async"} and out["overrides"] == FAST
    for mode, figures in out["modes"].items():
        assert (
            figures["steps_measured"] == 1 and figures["step_s"] > 0 and figures["engine_busy_share"] >= 0
        ), mode
    # synchronous, the engines' time is in the trainer's record (asynchronous, the last step draws nothing)
    assert out["modes"]["sync"]["generation_s"] > 0
    assert out["modes"]["sync"]["version_lag_max"] == 0 and out["modes"]["async"]["version_lag_max"] <= 1
    assert out["speedup"] > 0 and all(len(v) == 1 and v[0] > 0 for v in out["job_seconds"].values())
    plan = out["plan"]
    assert plan["calibrated"] and plan["sync_step_s"] > 0 and plan["async_step_s"] > 0
    assert (tmp_path / "sync0" / "steps.jsonl").exists() and (tmp_path / "async0" / "steps.jsonl").exists()


@pytest.mark.vllm
def test_peer_benchmark_runs_our_side_on_the_planners_layout():
    """Our side alone (`--without-trl`: TRL is not among the suite's dependencies): the planner picks the
    layout, one launch runs the workload, the step walls come from its span records. With TRL installed
    the same smoke runs both sides and computes the ratio."""
    small = [
        "--tokens",
        "8",
        "--prompts",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--ours",
        "auto",
    ]
    have_trl = importlib.util.find_spec("trl") is not None
    if not have_trl:
        missing = bench("peer_trl.py", *small, ok=False)
        assert (
            missing.returncode != 0 and "TRL is not installed: pip install --no-deps trl==" in missing.stderr
        )
    out = json.loads(bench("peer_trl.py", *small, *([] if have_trl else ["--without-trl"])).stdout)
    assert out["workload"]["ours_layout"] and out["workload"]["prompts_per_step"] == 2
    side = out["tokens_8"]["ours_auto"]
    assert "error" not in side, side
    assert side["median_step_s"] > 0 and side["steps_kept"] == 1 and side["startup_s"][0] > 0
    if have_trl:
        assert out["tokens_8"]["trl"]["median_step_s"] > 0 and out["tokens_8"]["ratio_auto"] > 0
    else:
        assert "trl" not in out["tokens_8"] and out["tokens_8"]["ratio_auto"] is None


def test_tools_check_logprobs_publishes_samples_and_agrees(tmp_path):
    """`torchrun --nproc-per-node 2 tools/check_logprobs.py grpo_tiny_cpu ...`: the recipe's TP2 trainer
    publishes into two colocated engines, which sample; the trainer's log-probs on their tokens agree
    (exit 0: within the recipe's thresholds)."""
    report = tmp_path / "check.json"
    args = [
        "grpo_tiny_cpu",
        "rollout.max_new_tokens=8",
        "--prompts",
        "2",
        "--prompt-len",
        "8",
        "--samples",
        "2",
    ]
    torchrun(REPO / "tools/check_logprobs.py", 2, [*args, "--json", str(report)], timeout=600)
    out = json.loads(report.read_text())
    assert out["recipe"] == "grpo_tiny_cpu" and out["version"] == 1 and out["problems"] == []
    assert out["sequences"] == 2 * 2 * 2, "2 engines x 2 prompts x 2 samples"
    assert out["tokens"] > 0 and out["max_abs_diff"] <= out["thresholds"]["max_gap"]
    assert out["thresholds"]["trainer_dtype"] == out["thresholds"]["engine_dtype"] == "fp32"


@needs_bwrap
@pytest.mark.vllm
def test_recovery_benchmark_kills_a_rank_and_times_the_resume():
    """benchmarks/recovery.py --smoke: rank 1 of the tiny run killed with SIGKILL in step 3; the rerun
    resumes from a checkpoint and redoes step 3 (and step 2 when its asynchronous save was still being
    written). Every part is measured and they add up to the total."""
    out = last_json(bench("recovery.py", "--smoke").stdout)
    killed = out["killed"]["in_step"]  # 3, or 4 when step 3 ended within the half step waited
    assert out["killed"]["rank"] == 1 and killed in (3, 4) and out["second_run_exit"] == 0
    assert 1 <= out["resumed_at_step"] < killed and out["lost_steps"] == killed - 1 - out["resumed_at_step"]
    for part in ("detection_s", "startup_s", "checkpoint_load_s", "rerun_s"):
        assert out[part] > 0, part
    assert out["requeue_source"] == "relaunch on this machine" and out["requeue_s"] == out["relaunch_s"]
    parts = ("detection_s", "requeue_s", "startup_s", "checkpoint_load_s", "rerun_s")
    assert out["total_s"] == pytest.approx(sum(out[p] for p in parts))


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm runs its daemons as root")
def test_recovery_benchmark_restarts_on_a_spare_node():
    """benchmarks/recovery.py --spares --smoke: the same kill in a job of its own local Slurm with a spare;
    the killed rank's node is left out and the run goes on from its checkpoint on the spare, in the same job.
    The parts are read from the job's log and add up to the total."""
    out = last_json(bench("recovery.py", "--spares", "--smoke").stdout)
    assert out["killed"]["host"] == "sim02" and out["left_out"] == ["sim02"] and out["second_run_exit"] == 0
    assert out["requeue_source"].startswith("a job step on a spare node")
    killed = out["killed"]["in_step"]
    assert killed in (3, 4) and 1 <= out["resumed_at_step"] < killed
    assert out["lost_steps"] == killed - 1 - out["resumed_at_step"]
    parts = ("detection_s", "requeue_s", "startup_s", "checkpoint_load_s", "rerun_s")
    assert all(out[p] > 0 for p in parts), out
    assert out["total_s"] == pytest.approx(sum(out[p] for p in parts))
