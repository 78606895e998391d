"""Routing replay end to end on a tiny Qwen3-MoE (vLLM CPU engine + megatron-core trainer, one process).

- The routes a CPU engine records (rollout/routes.py) are the experts transformers' own router picks
  for every fed position and layer.
- After a few updates, an engine in bf16 against the fp32 trainer: some (token, layer) pairs route
  differently; replaying the engine's routes makes the replayed forward use exactly its experts (checked
  per token and layer) and cuts the largest log-prob mismatch (benchmarks/routing_replay.py).
"""

import importlib.util
import json

import pytest
import torch

from megatron_rl.models.fixture import build_fixture
from tests.helpers.launch import REPO, free_port, run_workers, worker_result

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs the vLLM CPU build (make venv)"
    ),
]
BENCH = REPO / "benchmarks/routing_replay.py"
RECORD = REPO / "tests/integration/rollout/worker_routes.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The two processes, side by side (one engine each): {name: (its outcome, its JSON)}."""
    tmp = tmp_path_factory.mktemp("routing")
    fixture = build_fixture("qwen3_moe", tmp / "qwen3_moe")
    bench = ["--engine-dtype", "bfloat16", "--prompts", "16", "--samples", "4", "--out", str(tmp / "rr.json")]
    jobs = {"routes": (RECORD, [str(tmp / "routes.json"), str(fixture)]), "replay": (BENCH, bench)}
    done = run_workers(jobs, timeout=900, env={"MASTER_PORT": str(free_port())})  # the benchmark's world 1
    return {"routes": (done["routes"], tmp / "routes.json"), "replay": (done["replay"], tmp / "rr.json")}


def _result(runs, name) -> dict:
    outcome, out = runs[name]
    worker_result(outcome)
    return json.loads(out.read_text())


def test_recorded_routes_are_the_experts_transformers_picks(runs):
    r = _result(runs, "routes")
    print(r)
    assert r["pairs"] > 200 and r["agree"] == r["pairs"], r
    assert r["shapes_ok"], r


def test_replay_uses_the_engines_experts_and_cuts_the_mismatch(runs):
    r = _result(runs, "replay")
    print(r)
    assert r["replayed_equals_engine"], "a replayed forward chose other experts than the engine's"
    assert r["routes_differ_share"] > 0, "no route differs: the comparison below would mean nothing"
    assert r["with_replay"]["mismatch_max"] < r["without_replay"]["mismatch_max"]
    assert r["with_replay"]["mismatch_mean"] <= r["without_replay"]["mismatch_mean"]
    assert torch.isfinite(torch.tensor(r["with_replay"]["mismatch_mean"]))
