"""The launcher's seal (check/seal.py): a rank skips reading the problem set only for exactly the recipe
and the files the launcher checked; anything else checks in full."""

import json
import os
import time

import pytest

from megatron_rl.check.recipe import validate_recipe
from megatron_rl.check.seal import SEAL_ENV, seal, sealed
from megatron_rl.config.load import load_recipe
from megatron_rl.config.problem import ConfigError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from megatron_rl.models.fixture import build_fixture

    return build_fixture("qwen2", tmp_path_factory.mktemp("ckpt") / "qwen2")


def _problems(path, prompt="Write add(a, b)."):
    row = {"id": "p0", "prompt": prompt, "tests": "assert add(1, 2) == 3", "entry_point": "add"}
    path.write_text(json.dumps(row) + "\n")
    return path


def _recipe(checkpoint, data, *more):
    return load_recipe(
        "grpo_tiny_hf_cpu", [f"model.hf_checkpoint={checkpoint}", f"data.source={data}", *more]
    )


def test_the_same_recipe_and_files_are_sealed(tmp_path, checkpoint):
    data = _problems(tmp_path / "p.jsonl")
    cfg = _recipe(checkpoint, data)
    assert sealed(_recipe(checkpoint, data), {SEAL_ENV: seal(cfg)})


def test_no_seal_another_override_or_a_changed_file_checks_in_full(tmp_path, checkpoint):
    data = _problems(tmp_path / "p.jsonl")
    cfg = _recipe(checkpoint, data)
    mark = {SEAL_ENV: seal(cfg)}
    assert not sealed(cfg, {})
    assert not sealed(cfg, {SEAL_ENV: "0" * 64})
    assert not sealed(_recipe(checkpoint, data, "data.max_prompt_tokens=100"), mark)
    _problems(data, prompt="Write add(a, b), and a much longer prompt this time.")  # edited in place
    assert not sealed(cfg, mark)
    data.write_text(data.read_text())  # same bytes, a new modification time
    os.utime(data, ns=(1, 1))
    assert not sealed(cfg, mark)
    cfg3 = _recipe(checkpoint, data)
    mark3 = {SEAL_ENV: seal(cfg3)}
    before = data.stat()
    time.sleep(0.01)
    data.write_text(data.read_text().replace("add(1, 2)", "add(2, 1)"))  # same size, other contents
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the old modification time back
    assert data.stat().st_size == before.st_size and data.stat().st_mtime_ns == before.st_mtime_ns
    assert not sealed(cfg3, mark3)
    tok = checkpoint / "tokenizer_config.json"
    restore = tok.stat().st_mtime_ns
    cfg2 = _recipe(checkpoint, data)
    mark2 = {SEAL_ENV: seal(cfg2)}
    os.utime(tok, ns=(restore + 10**9, restore + 10**9))  # the tokenizer the prompts were read with
    try:
        assert not sealed(cfg2, mark2)
    finally:
        os.utime(tok, ns=(restore, restore))
    assert not sealed(cfg2, mark2)  # its old time back, but the change time says it was touched
    assert sealed(cfg2, {SEAL_ENV: seal(cfg2)})


def test_a_sealed_rank_skips_the_prompt_read_and_an_unsealed_one_refuses(tmp_path, checkpoint):
    data = _problems(tmp_path / "p.jsonl", prompt="word " * 400)  # longer than max_prompt_tokens
    cfg = _recipe(checkpoint, data)
    with pytest.raises(ConfigError, match="data.max_prompt_tokens"):
        validate_recipe(cfg)
    assert validate_recipe(cfg, read_data=False).recipe.data.source == str(data)
