"""Engine arguments decided before vLLM is imported."""

import json

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
