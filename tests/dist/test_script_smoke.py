"""The multi-process benchmarks in their smoke modes (tiny models, one repeat), run as a user runs them:
each must exit 0 and print its JSON with every figure measured, so a refactor that breaks one fails the
suite (benchmarks/reshard.py once crashed unnoticed on a layout argument that had gone). Their numbers
are not judged here: benchmarks are not timed tests (DESIGN.md section 8)."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.launch import REPO, torchrun

pytestmark = pytest.mark.slow


def test_reshard_benchmark_publishes_every_layout_within_its_memory_bound():
    """`python benchmarks/reshard.py --smoke`: it launches itself under torchrun (4 gloo processes)."""
    from benchmarks.reshard import LAYOUTS, SMOKE_BUCKETS_MIB

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "benchmarks/reshard.py", "--smoke"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["world"] == 4 and out["backend"] == "gloo" and out["model"] == "llama_smoke"
    assert set(out["layouts"]) == {name for name, _, _ in LAYOUTS}
    for name, lay in out["layouts"].items():
        assert lay["bytes_moved"] > 0 and lay["publish_s"] > 0 and lay["all_gather_s"] > 0, name
        assert lay["ratio"] > 0 and lay["transfer_s"] > 0 and lay["validate_s"] >= 0, name
    sweep = out["memory_vs_bucket"]["sweep"]
    assert [s["bucket_MiB"] for s in sweep] == SMOKE_BUCKETS_MIB
    assert all(s["within_bound"] and s["buckets"] >= 1 for s in sweep), sweep


def test_checkpoint_benchmark_saves_verifies_and_loads(tmp_path):
    """`torchrun --nproc-per-node 2 benchmarks/checkpoint.py --smoke`: the tiny model at TP2."""
    proc = torchrun("benchmarks/checkpoint.py", 2, ["--smoke", "--out", str(tmp_path)], timeout=300)
    report = json.loads(proc.stdout[proc.stdout.index("{\n") :])
    assert report["layout"] == "tp2" and report["world_size"] == 2
    [name] = [k for k in report if k not in ("layout", "world_size")]  # the tiny model alone
    figures = report[name]
    assert figures["sync"]["complete"] and figures["async"]["complete"], figures
    assert figures["verifies"] and figures["bytes"] > 0 and figures["load_s"] > 0
    assert len(figures["async_blocking_with_integrity_s"]) == len(figures["baseline_async_blocking_s"]) == 1
    assert (tmp_path / name / "sync" / "step_000001" / "COMPLETE").exists(), "--out keeps what it wrote"
