"""Engine arguments decided before vLLM is imported."""

import json
import re

import pytest

from megatron_rl.rollout.vllm_engine import engine_dtype


def test_dtype_is_explicit_never_auto(tmp_path):
    # vLLM's "auto" runs a float32 checkpoint in half precision; the adapter always names the dtype.
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert engine_dtype(tmp_path, None) == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert engine_dtype(tmp_path, None) == "bfloat16"
    assert engine_dtype(tmp_path, "fp32") == "float32"
    (tmp_path / "config.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match="names no dtype"):
        engine_dtype(tmp_path, None)
    with pytest.raises(ValueError, match="engine dtype must be one of"):
        engine_dtype(tmp_path, "auto")


def test_moe_engine_settings_the_cpu_build_cannot_serve_are_refused_before_vllm_starts(tmp_path):
    """A CPU MoE engine at TP 2, an expert-parallel one, and route recording on a dense model: each is
    refused by name before any vLLM engine is built (the model folder holds a config.json only)."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU-build refusals")
    from megatron_rl.models.tiny import hf_config
    from megatron_rl.rollout.vllm_engine import VLLMEngine
    from tests.helpers.specs import QWEN2_TINY, QWEN3_MOE_TINY
    from tests.integration.rollout.cases import rollout_cfg

    moe, dense = tmp_path / "moe", tmp_path / "dense"
    hf_config(QWEN3_MOE_TINY).save_pretrained(moe)
    hf_config(QWEN2_TINY).save_pretrained(dense)
    from megatron_rl.check.recipe import check_recipe
    from megatron_rl.config.load import load_recipe
    from megatron_rl.rollout.engine_rules import engine_problems

    cfg = rollout_cfg()
    # The one rule (rollout/engine_rules.py): the engine refuses with the words `validate` uses.
    base = dict(on_gpu=False, num_experts=0, engine_tp=1, expert_parallel=False, record_routes=False)
    cases = [
        ("layout.engine_tp", dict(num_experts=4, engine_tp=2), lambda: VLLMEngine(cfg, moe, tp=2)),
        (
            "layout.engine_ep",
            dict(expert_parallel=True),
            lambda: VLLMEngine(cfg, dense, expert_parallel=True),
        ),
        (
            "algorithm.routing_replay",
            dict(record_routes=True),
            lambda: VLLMEngine(cfg, dense, record_routes=True),
        ),
    ]
    for key, args, build in cases:
        [(got_key, message)] = engine_problems(**{**base, **args})
        assert got_key == key
        with pytest.raises(ValueError, match=re.escape(message)):
            build()
    recipe = load_recipe("grpo_tiny_moe_cpu", ["layout.engine_tp=2", "layout.engine_count=1"])
    said = {p.key: p.message for p in check_recipe(recipe)}
    assert said["layout.engine_tp"] == engine_problems(False, 4, 2, False)[0][1]
