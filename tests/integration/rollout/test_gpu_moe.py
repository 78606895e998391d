"""GPU-only MoE engine paths (skipped without CUDA): in-place expert delivery into vLLM's fused MoE and
vLLM's own routed-experts capture for routing replay. On CPU the same layouts are checked byte for byte
against an oracle (tests/unit/reshard/test_plan.py) and the routes come from rollout/routes.py's recorder
(tests/integration/rollout/test_routing_replay.py); vLLM's CPU build has neither path."""

import importlib.util
import json
import os

import pytest
import torch

from megatron_rl.models.fixture import build_fixture
from tests.helpers.launch import REPO, run_worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and the official vLLM build"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM"),
]
WORKER = REPO / "tests/integration/rollout/worker_gpu_moe.py"


@pytest.fixture(scope="module")
def r(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_moe")
    fixture = build_fixture("qwen3_moe", tmp / "qwen3_moe")
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": os.environ.get("MASTER_PORT", "29519")}  # fmt: skip
    out = tmp / "gpu_moe.json"
    run_worker(WORKER, [str(out), str(fixture)], timeout=900, env=env)
    return json.loads(out.read_text())


def test_inplace_expert_delivery_serves_the_published_weights(r):
    assert r["versions"] == [1] and r["max_abs_diff"] <= 1e-4, r


def test_vllm_routed_experts_are_transformers_top_k(r):
    assert r["route_pairs"] > 200 and r["routes_agree"] == r["route_pairs"], r
