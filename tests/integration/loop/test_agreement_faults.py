"""Conversion faults the checksums cannot see, injected into real runs' publications (reshard/faults.py):
on the colocated, separated and MoE paths, every faulty version is refused by the log-prob probe before
it serves (loop/placement/probe.py), the version before it keeps serving, and the clean versions after it activate;
a clean HF-fixture run with a bf16 engine raises no alarm (fp32 clean runs: test_tiny_loop, test_hf_path,
test_tiny_moe and test_separated assert the same of theirs).

Each run: version 1 clean, one fault per version from 2 on, then clean versions again; the refusal
policy's limit is raised so that the run goes on through every fault (the default, three in a row, is
tested in tests/unit/loop/placement/test_probe_policy.py). The three runs are benchmarks/agreement.py's fault runs
(its smoke run too: tests/integration/test_script_smoke.py runs only its cost part), launched once with
the probe's verdict back at `refuse` and kept; its report of them is checked too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megatron_rl.reshard.faults import DENSE, MOE
from tests.helpers.launch import REPO
from tests.helpers.tiny_run import FAST, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
# The benchmark's overrides (QUIET, checkpoint.interval=0, rollout.dtype=fp32, and FAST as here), then:
GO_ON = ["rollout.on_logprob_disagreement=refuse", "rollout.max_refused_publications=20"]
# test path -> (the benchmark's path, its recipe, the faults injected from version 2 on)
PATHS = {
    "colocated": ("dense", "grpo_tiny_cpu", DENSE),
    "separated": ("separated", "grpo_tiny_cpu_separated", DENSE),
    "moe": ("moe", "grpo_tiny_moe_cpu", DENSE + MOE),
}


def _plan(faults) -> dict[int, str]:
    return {v: f for v, f in enumerate(faults, start=2)}


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory):
    """`benchmarks/agreement.py` over the three paths (fp32 engines, no cost runs), its runs kept:
    (the folder, its JSON report)."""
    from benchmarks.agreement import FAST as BENCH_FAST

    assert set(BENCH_FAST) == {o for o in FAST if not o.startswith("logger.")}, (
        "the runs' batch is the tests'"
    )
    tmp = tmp_path_factory.mktemp("faults")
    paths = ",".join(bench for bench, _, _ in PATHS.values())
    cmd = [sys.executable, "benchmarks/agreement.py", "--paths", paths, "--engine-dtypes", "fp32"]
    cmd += ["--cost-steps", "0", "--overrides", " ".join(GO_ON), "--keep", str(tmp)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return tmp, json.loads(done.stdout)


@pytest.fixture(scope="module", params=sorted(PATHS))
def faulty(request, benchmark):
    bench, recipe, faults = PATHS[request.param]
    tmp, report = benchmark
    name = f"{bench}-fp32"  # the benchmark's run name: path-engine dtype
    [run] = [r for r in report["runs"] if r["recipe"] == recipe]
    return _plan(faults), records(tmp, name), (tmp / f"{name}.log").read_text(), run


def test_every_faulty_version_is_refused_before_it_serves(faulty):
    plan, recs, console, _ = faulty
    by_step = {r["step"]: r for r in recs}
    assert sorted(by_step) == list(range(1, len(plan) + 4))
    for version, fault in plan.items():
        r = by_step[version]  # step s publishes version s
        pub = r["publication"]
        assert not pub["activated"], (fault, pub)
        assert pub["probe"]["version"] == version and pub["probe"]["passed"] is False, (fault, pub["probe"])
        assert pub["refused"][0].startswith("log-prob probe (fp32 trainer, fp32 engine): engine "), fault
        # The manifest passed (the bytes arrived as sent): the probe alone refused it.
        assert len(pub["refused"]) == 1
        assert r["version"] == 1 and pub["action"] == "sampled with the active version 1", fault
        line = f"publication of version {version} (step {version}) refused"
        assert console.count(line) == 1, (fault, console[-3000:])


def test_clean_versions_serve_and_agree(faulty):
    plan, recs, _, _ = faulty
    for r in recs:
        if r["step"] in plan:
            continue
        pub = r["publication"]
        assert pub["activated"] and pub["probe"]["passed"], (r["step"], pub)
        assert pub["probe"]["max_abs_diff"] < pub["probe"]["max_gap"] / 5, pub["probe"]
        assert r["logprob_agreement"]["problems"] == []
    assert recs[-1]["version"] == len(plan) + 3  # the last step's version activated and served


def test_the_benchmark_reports_every_fault_caught_and_no_clean_version_flagged(faulty):
    plan, _, _, run = faulty
    assert run["engine_dtype"] == "fp32" and set(run["faults"]) == set(plan.values())
    assert all(f["caught"] and plan[f["version"]] == name for name, f in run["faults"].items()), run["faults"]
    assert run["clean"]["flagged"] == [] and run["margin"]["weakest_fault_over_threshold"] > 1
    assert run["margin"]["threshold_over_clean_max"] > 1 and run["probe_seconds_median"] > 0


@pytest.fixture(scope="module")
def hf_bf16(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-bf16")
    env = {"MEGATRON_RL_FIXTURES": os.environ["MEGATRON_RL_FIXTURES"]}
    extra = ["rollout.dtype=bf16", "logger.wandb=false", "checkpoint.interval=0"]
    launch(tmp, 3, extra, name="b", recipe="grpo_tiny_hf_cpu", env=env)
    return records(tmp, "b")


def test_a_bf16_engine_serving_an_fp32_trainer_raises_no_alarm(hf_bf16):
    for r in hf_bf16:
        probe = r["publication"]["probe"]
        assert probe["passed"] and r["publication"]["activated"], probe
        assert r["logprob_agreement"]["problems"] == [], r["logprob_agreement"]
        # bf16 rounding, well above fp32's and well under the bf16 thresholds
        assert 1e-4 < probe["max_abs_diff"] < probe["max_gap"] / 3, probe
