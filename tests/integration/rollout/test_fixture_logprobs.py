"""Engine log-probs agree with transformers on every released-format fixture family, past the
original context where Llama-3.1's RoPE scaling acts (~20 s a family on 2 cores). The trainer's side of
the same agreement is tests/dist/trainer/test_foundation.py (llama31_tiny_scaled included)."""

import importlib.util
import json

import pytest

from megatron_rl.models.fixture import build_fixture
from tests.helpers.launch import REPO, run_worker

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs the vLLM CPU build (make venv)"
    ),
]
WORKER = REPO / "tests/integration/rollout/worker_fixture_logprobs.py"


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "qwen3_moe"])
def test_engine_logprobs_match_transformers(tmp_path, family):
    fixture = build_fixture(family, tmp_path / family)
    out = tmp_path / "r.json"
    run_worker(WORKER, [str(out), str(fixture)])
    r = json.loads(out.read_text())
    print(family, r)
    assert r["tokens"] > 0 and r["longest"] > 64  # past the llama fixture's original context
    if family == "llama":
        assert (
            r["rope"].get("rope_type") == "llama3" and r["rope"].get("original_max_position_embeddings") == 64
        )
    assert r["max_abs_diff"] <= 1e-4, r


def test_published_moe_experts_serve_the_published_weights(tmp_path):
    """A Qwen3-MoE engine that receives its weights as a publication (dummy start, vLLM's reload) serves
    them: vLLM's CPU reload leaves the experts unpacked (rollout/moe_reload.py), so each layer is
    repacked after it; without that the log-probs were 0.12 nats off. When a vLLM release repacks them
    itself, `experts_repacked` drops to 0 and this test says so."""
    fixture = build_fixture("qwen3_moe", tmp_path / "qwen3_moe")
    out = tmp_path / "r.json"
    run_worker(WORKER, [str(out), str(fixture), "reload"])
    r = json.loads(out.read_text())
    print(r)
    assert r["max_abs_diff"] <= 1e-4, r
    assert r["experts_repacked"] == 2, "vLLM now repacks reloaded experts itself: drop rollout/moe_reload.py"
