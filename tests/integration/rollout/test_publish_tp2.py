"""Trainer TP2 -> two colocated TP1 vLLM CPU engines through the reshard publisher, checked against
the trainer's own teacher-forced log-probs on the engines' exact tokens (~1 min on 2 cores).

Tolerance: both sides run fp32 on CPU with logits of std ~6 (lm_head scaled 20x); they differ only in
kernels and summation order. Measured max |diff| 1.0e-5 (ratio within 1 +- 1e-5); the check's
threshold is 1e-3 nats, 100x above that and 1000x below what one optimizer step moves (> 1 nat here),
so a stale weight, a wrong mapping or a stale prefix cache cannot hide under it.
"""

import importlib.util
import json

import pytest

from tests.helpers.launch import torchrun
from tests.integration.rollout.cases import write_model_dir

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs the vLLM CPU build (make venv)"
    ),
]
WORKER = "tests/integration/rollout/worker_publish.py"
TOL = 1e-4


@pytest.fixture(scope="module")
def r(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("publish")
    model_dir = write_model_dir(tmp / "model")
    torchrun(WORKER, 2, [str(tmp), model_dir], timeout=900)
    return json.loads((tmp / "publish.json").read_text())


@pytest.mark.parametrize("rnd", ["round1", "round2"])
def test_engine_logprobs_agree_with_the_trainer(r, rnd):
    x = r[rnd]
    assert x["activated"] and x["problems"] == []
    for rep in (x["report"], x["greedy_report"]):
        assert rep["max_abs_diff"] < TOL, rep
        assert rep["beyond_threshold"] == [] and rep["nonfinite_tokens"] == 0
        assert abs(rep["ratio_max"] - 1) < TOL and abs(rep["ratio_min"] - 1) < TOL
    assert x["report"]["sequences"] == 8 and x["report"]["tokens"] == 8 * 16


def test_the_version_travels_with_every_sample(r):
    assert r["round1"]["version"] == 1 and r["round1"]["versions"] == [1]
    assert r["round2"]["version"] == 2 and r["round2"]["versions"] == [2]
    assert r["round1"]["report"]["version"] == 1 and r["round2"]["report"]["version"] == 2


def test_second_publication_changes_outputs_as_the_new_weights_dictate(r):
    # The optimizer step moved the policy: the new trainer disagrees with the old samples ...
    assert r["moved"]["mean_abs_diff"] > 0.1
    # ... the engines' greedy continuation of the long prompt changed ...
    assert r["round1"]["greedy_tokens"][0] != r["round2"]["greedy_tokens"][0]
    # ... and still agrees with the trainer (round 2 above), although that 150-token prompt's first KV
    # block was cached under version 1: the publication reset the prefix cache.
    assert r["round2"]["greedy_report"]["max_abs_diff"] < TOL


def test_engines_sample_independently(r):
    # Same prompt, engine 0 vs engine 1: per-engine request seeds.
    assert r["round1"]["engines_differ"]


def test_a_conversion_fault_is_refused_by_the_probe_and_the_previous_version_serves_again(r):
    """Same bytes in and out (the manifest passes), another model: only the probe sees it. After the
    roll-back the engines serve version 2 token for token, and agree with the trainer again."""
    x = r["round3"]
    assert not x["activated"] and x["action"] == "sampled with the active version 2" and x["served"] == 2
    assert x["probe"]["version"] == 3 and x["probe"]["passed"] is False
    assert x["probe"]["max_abs_diff"] > 100 * x["probe"]["max_gap"], x["probe"]
    assert "log-prob probe (fp32 trainer, fp32 engine): engine 0" in x["problems"][0]
    assert x["greedy_tokens"] == r["round2"]["greedy_tokens"]
    after = x["probe_after"]
    assert after["passed"] and after["max_abs_diff"] < after["max_gap"] and after["tokens"] == 2 * 4 * 31
