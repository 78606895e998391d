"""GPU-only rollout paths: sleep/wake, in-place delivery, trainer offload (skipped without CUDA)."""

import importlib.util
import json
import os

import pytest
import torch

from tests.helpers.launch import REPO, run_worker
from tests.integration.rollout.cases import write_model_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and the official vLLM build"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM"),
]
WORKER = REPO / "tests/integration/rollout/worker_gpu.py"
TOL = 1e-4  # fp32 engine vs fp32 HF, as on CPU


@pytest.fixture(scope="module")
def r(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    model_dir = write_model_dir(tmp / "model")
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": os.environ.get("MASTER_PORT", "29517"),
    }
    out = tmp / "gpu.json"
    run_worker(WORKER, [str(out), model_dir], timeout=900, env=env)
    return json.loads(out.read_text())


def test_sleep_frees_memory_and_wakes_in_two_steps(r):
    m = r["memory_gib"]
    assert r["slept"] is True
    assert m["asleep"] < m["awake"] - 0.05
    assert m["asleep"] <= m["weights_only"] < m["woken"]
    assert r["v1_diff"] < TOL


def test_inplace_delivery_takes_effect(r):
    assert r["inplace_diff"] < TOL and r["inplace_versions"] == [2]


def test_level2_sleep_needs_a_publication(r):
    assert r["level2_refused"] and r["level2_diff"] < TOL


def test_an_inplace_roll_back_serves_the_previous_version_again(r):
    assert r["swap_kept_previous"] and r["restored_version"] == 3 and r["restored_diff"] < TOL


def test_trainer_offload_round_trip(r):
    assert r["offloaded"] and r["restored"]
    assert r["offload_freed_gib"] > 0
    assert r["offload_step_max_diff"] < 1e-6
