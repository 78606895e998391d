"""The in-package fixtures are checkpoints transformers loads as it loads the released ones, with each
family's end ids, chat template and RoPE; and stop ids are read from any such directory."""

from __future__ import annotations

import json
import os

import pytest
import torch

from megatron_rl.models.checkpoint import stop_token_ids, tokenizer_eos_id
from megatron_rl.models.fixture import FAMILIES, MARKER, SIZE, build_fixture, main

USER = [{"role": "user", "content": "Write a Python function `add(a, b)` that returns a + b."}]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fixtures")
    return {f: build_fixture(f, root / f) for f in FAMILIES}


def _json(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_loads_model_and_tokenizer(fixtures, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = fixtures[family]
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (d / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    tok = AutoTokenizer.from_pretrained(d)
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (
        family,
        SIZE.num_layers,
        SIZE.hidden_size,
        SIZE.num_attention_heads,
    )
    assert cfg.num_key_value_heads == SIZE.num_query_groups and cfg.head_dim == SIZE.head_dim
    # Qwen pads the embedding past the tokenizer (to a multiple of 128); Llama-3's is exact.
    assert cfg.vocab_size == (len(tok) if family == "llama" else -(-len(tok) // 128) * 128)
    ids = tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    assert tok.decode(ids) == "def add(a, b):\n    return a + b\n"
    assert len(ids) < 20  # BPE trained on the bundled code: whole words and indents, not bytes
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg.vocab_size) and torch.isfinite(logits).all()
    assert tok.pad_token_id is not None and tok.eos_token_id is not None


def test_chat_templates_render_in_each_family_style(fixtures):
    from transformers import AutoTokenizer

    def render(family, **kw):
        tok = AutoTokenizer.from_pretrained(fixtures[family])
        return tok, tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False, **kw)

    tok, text = render("qwen2")
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert f"<|im_start|>user\n{USER[0]['content']}<|im_end|>\n" in text
    ids = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=True, return_dict=False)
    tail = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-len(tail) :] == tail and tail[0] == tok.convert_tokens_to_ids("<|im_start|>")
    _, text = render("qwen3", enable_thinking=False)
    assert text.startswith("<|im_start|>user\n") and text.endswith("assistant\n<think>\n\n</think>\n\n")
    tok, text = render("llama")
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n")
    assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids.count(tok.bos_token_id) == 1  # the template's bos, not a second one from encoding


def test_qwen2_has_two_end_ids_and_stops_at_both(fixtures):
    from transformers import AutoTokenizer

    d = fixtures["qwen2"]
    tok = AutoTokenizer.from_pretrained(d)
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert _json(d / "generation_config.json")["eos_token_id"] == [im_end, endoftext]
    assert _json(d / "config.json")["eos_token_id"] == im_end  # as Qwen2.5-Instruct's config.json
    assert stop_token_ids(d) == sorted([im_end, endoftext])
    assert min(im_end, endoftext) >= SIZE.bpe_vocab  # special tokens after the regular vocabulary


def test_qwen3_has_qk_norm_and_tied_embeddings(fixtures):
    from safetensors import safe_open

    d = fixtures["qwen3"]
    cfg = _json(d / "config.json")
    assert cfg["tie_word_embeddings"] is True
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.q_norm.weight" in names and "lm_head.weight" not in names
    assert not any(n.endswith("q_proj.bias") for n in names)
    assert len(stop_token_ids(d)) == 2


def test_llama_has_llama3_rope_scaling_and_three_end_ids(fixtures):
    from transformers import AutoConfig, AutoTokenizer

    d = fixtures["llama"]
    cfg = _json(d / "config.json")
    assert cfg["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert cfg["rope_theta"] == 500000.0 and cfg["max_position_embeddings"] == 512
    loaded = AutoConfig.from_pretrained(d).rope_parameters  # transformers reads the released layout
    assert loaded["rope_type"] == "llama3" and loaded["factor"] == 8.0
    tok = AutoTokenizer.from_pretrained(d)
    ends = tok.convert_tokens_to_ids(["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"])
    assert tok.eos_token == "<|eot_id|>"
    assert stop_token_ids(d) == sorted(ends)


def test_reused_when_complete_refused_when_foreign(fixtures, tmp_path):
    d = fixtures["qwen2"]
    stamp = os.stat(d / "model.safetensors").st_mtime_ns
    assert build_fixture("qwen2", d) == d
    assert os.stat(d / "model.safetensors").st_mtime_ns == stamp  # reused, not rebuilt
    with pytest.raises(FileExistsError, match=MARKER):
        build_fixture("qwen2", d, seed=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_fixture("llama", tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="unknown fixture family"):
        build_fixture("mistral", tmp_path / "m")


def test_deterministic_for_a_seed_and_built_by_the_cli(fixtures, tmp_path, capsys):
    assert main(["qwen2", str(tmp_path / "again")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (fixtures["qwen2"] / name).read_bytes(), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no build folder left behind
    assert main(["qwen2", str(fixtures["llama"])]) == 1  # a different fixture is there: refused


def test_stop_ids_from_config_json_alone_and_a_string_eos(tmp_path):
    """No generation_config.json: config.json's eos (as HF derives a generation config); an int or a list."""
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert stop_token_ids(tmp_path) == [7]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 3]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [], "model": {"vocab": {"</s>": 2}}})
    )
    assert tokenizer_eos_id(tmp_path) == 2
    assert stop_token_ids(tmp_path) == [2, 3, 9]
    with pytest.raises(FileNotFoundError, match="config.json"):
        stop_token_ids(tmp_path / "missing")
