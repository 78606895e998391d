"""A live vLLM CPU engine on the qwen2 fixture stops at both of Qwen's end ids once it is given the
checkpoint's stop ids, and runs to the length cap without them (its own process, ~30 s on 2 cores).

Oracle: transformers' greedy decoding on the same crafted weights (worker_stop_ids.py) walks the same
chain, so a stop is the engine honouring the id, not a chain the engine alone produced.
"""

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
WORKER = REPO / "tests/integration/rollout/worker_stop_ids.py"
CAP = 8  # worker_stop_ids.CAP


def greedy_chain(chain: list[int]) -> list[int]:
    """The crafted chain, then its last two tokens in turn, CAP tokens in all."""
    return (chain + chain[-2:] * CAP)[:CAP]


@pytest.fixture(scope="module")
def r(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stop_ids")
    fixture = build_fixture("qwen2", tmp / "qwen2")
    out = tmp / "result.json"
    run_worker(WORKER, [str(out), str(fixture)])
    return json.loads(out.read_text())


def test_the_engine_is_given_both_end_ids(r):
    assert r["stop_ids"] == sorted(r["end_ids"].values())
    assert r["engine_stop_ids"] == r["stop_ids"]


@pytest.mark.parametrize("end", ["im_end", "endoftext"])
def test_greedy_completion_stops_at_the_end_id(r, end):
    case = r["runs"][end]
    assert case["hf_greedy"] == greedy_chain(case["chain"])
    end_id = r["end_ids"][end]
    stop_at = case["chain"].index(end_id) + 1
    assert case["with"] == {"tokens": case["chain"][:stop_at], "reason": "stop", "truncated": False}


@pytest.mark.parametrize("end", ["im_end", "endoftext"])
def test_without_the_checkpoint_ids_it_runs_to_the_cap(r, end):
    case = r["runs"][end]
    assert case["without"]["reason"] == "length" and case["without"]["truncated"]
    assert case["without"]["tokens"] == case["hf_greedy"]  # past the end id, to max_new_tokens
