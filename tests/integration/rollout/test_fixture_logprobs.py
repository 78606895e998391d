"""Engine log-probs agree with transformers on every released-format fixture family, past the
original context where Llama-3.1's RoPE scaling acts (~20 s a family on 2 cores). The trainer's side of
the same agreement is tests/dist/trainer/test_foundation.py (llama31_tiny_scaled included)."""

import importlib.util
import json

import pytest

from megatron_rl.models.fixture import build_fixture
from tests.helpers.launch import REPO, run_workers, worker_result

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs the vLLM CPU build (make venv)"
    ),
]
WORKER = REPO / "tests/integration/rollout/worker_fixture_logprobs.py"
FAMILIES = ["qwen2", "qwen3", "llama", "qwen3_moe"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """Every case's worker (one engine process each, two at a time): {case: its result or failure}. A case
    is a family, or `reload` (the qwen3_moe fixture's tensors given as a publication)."""
    tmp = tmp_path_factory.mktemp("fixture_logprobs")
    fixtures = {family: build_fixture(family, tmp / family) for family in FAMILIES}
    jobs = {f: (WORKER, [str(tmp / f"{f}.json"), str(fixtures[f])]) for f in FAMILIES}
    jobs["reload"] = (WORKER, [str(tmp / "reload.json"), str(fixtures["qwen3_moe"]), "reload"])
    done = run_workers(jobs)
    return {case: (done[case], tmp / f"{case}.json") for case in jobs}


def _result(results, case) -> dict:
    outcome, out = results[case]
    worker_result(outcome)  # this case's failure, raised in its own test
    return json.loads(out.read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_logprobs_match_transformers(results, family):
    r = _result(results, family)
    print(family, r)
    assert r["tokens"] > 0 and r["longest"] > 64  # past the llama fixture's original context
    if family == "llama":
        assert (
            r["rope"].get("rope_type") == "llama3" and r["rope"].get("original_max_position_embeddings") == 64
        )
    assert r["max_abs_diff"] <= 1e-4, r


def test_published_moe_experts_serve_the_published_weights(results):
    """A Qwen3-MoE engine that receives its weights as a publication (dummy start, vLLM's reload) serves
    them: vLLM's CPU reload leaves the experts unpacked (rollout/moe_reload.py), so each layer is
    repacked after it; without that the log-probs were 0.12 nats off. When a vLLM release repacks them
    itself, `experts_repacked` drops to 0 and this test says so."""
    r = _result(results, "reload")
    print(r)
    assert r["max_abs_diff"] <= 1e-4, r
    assert r["experts_repacked"] == 2, "vLLM now repacks reloaded experts itself: drop rollout/moe_reload.py"
