"""With model.hf_checkpoint set, its config.json is the model: unset keys are read from it, set keys
must agree (validate names the key), and a laptop that cannot read it says so instead of guessing."""

from __future__ import annotations

import json

import pytest

from megatron_rl.check.recipe import check_recipe, notes, refused
from megatron_rl.config.load import load_recipe
from megatron_rl.config.schema import ModelConfig
from megatron_rl.models.resolve import COMPARED, fields_from_config, resolve_model
from megatron_rl.models.spec import ModelSpec
from megatron_rl.models.tiny import hf_config, tiny_spec
from tests.helpers.specs import LLAMA31_TINY_SCALED

# The tiny recipe's model (conf/model/tiny_qwen2.yaml) as a checkpoint config.
TINY = tiny_spec(vocab_size=17, make_vocab_size_divisible_by=32, max_position_embeddings=256)
UNSET = [f"model.{k}=null" for k in COMPARED if k != "family"] + ["model.family=null", "model.name=''"]


def _checkpoint(tmp_path, spec=TINY):
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    hf_config(spec).save_pretrained(d)  # config.json as transformers writes it
    return d


def test_a_recipe_that_only_names_the_checkpoint_gets_its_shape(tmp_path):
    d = _checkpoint(tmp_path)
    recipe = load_recipe("grpo_tiny_cpu", [*UNSET, f"model.hf_checkpoint={d}"])
    assert recipe.model.num_layers is None  # the recipe as written
    spec = ModelSpec.from_config(recipe.model)
    for key in (
        "family",
        "num_layers",
        "hidden_size",
        "num_query_groups",
        "vocab_size",
        "rope_theta",
        "qkv_bias",
    ):
        assert getattr(spec, key) == getattr(TINY, key), key
    assert spec.name == "ckpt"
    assert [p for p in check_recipe(recipe) if p.kind != "files"] == []


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.num_layers=4", "model.num_layers"),
        ("model.num_query_groups=4", "model.num_query_groups"),
        ("model.vocab_size=32", "model.vocab_size"),
        ("model.rope_theta=500000", "model.rope_theta"),
        ("model.tie_word_embeddings=true", "model.tie_word_embeddings"),
        ("model.qkv_bias=false", "model.qkv_bias"),
        ("model.norm_eps=1e-5", "model.norm_eps"),
        ("model.max_position_embeddings=4096", "model.max_position_embeddings"),
        ("model.family=llama", "model.family"),
    ],
)
def test_a_key_that_disagrees_with_the_checkpoint_is_refused_by_name(tmp_path, override, key):
    d = _checkpoint(tmp_path)
    recipe = load_recipe("grpo_tiny_cpu", [f"model.hf_checkpoint={d}", override])
    problems = [p for p in check_recipe(recipe) if p.key == key]
    assert problems and "config.json says" in problems[0].message, check_recipe(recipe)
    assert refused(problems, "validate")


def test_the_shipped_model_group_agrees_with_its_own_checkpoint(tmp_path):
    d = _checkpoint(tmp_path)  # every key stated by the recipe, all equal to config.json
    assert [
        p
        for p in check_recipe(load_recipe("grpo_tiny_cpu", [f"model.hf_checkpoint={d}"]))
        if p.kind != "files"
    ] == []


def test_llama31_rope_scaling_is_read_from_the_checkpoint(tmp_path):
    cfg = hf_config(LLAMA31_TINY_SCALED).to_dict()
    fields = fields_from_config(cfg)
    assert fields["rope_scaling"] == "llama3" and fields["rope_original_max_position"] == 8
    # The transformers-4 spelling real Llama-3.1 checkpoints carry.
    old = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    old["rope_theta"] = 500000.0
    old["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    assert fields_from_config(old)["rope_original_max_position"] == 8192
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(old))
    spec = ModelSpec.from_config(resolve_model(ModelConfig(hf_checkpoint=str(d), params_dtype="fp32")))
    assert (spec.rope_scaling, spec.rope_scaling_factor, spec.rope_theta) == ("llama3", 8.0, 500000.0)


def test_the_70b_recipe_states_llama31_scaling():
    spec = ModelSpec.from_config(load_recipe("grpo_llama3.1-70b_8n8g").model)
    assert (spec.rope_scaling, spec.rope_scaling_factor, spec.rope_original_max_position) == (
        "llama3",
        8.0,
        8192,
    )


def test_an_unreadable_checkpoint_is_noted_by_validate_and_refused_by_plan_and_driver(tmp_path):
    recipe = load_recipe("grpo_tiny_cpu", [*UNSET, f"model.hf_checkpoint={tmp_path}/on_the_cluster"])
    problems = check_recipe(recipe)
    assert problems and not refused(problems, "validate")
    assert refused(problems, "plan") and refused(problems, "run")
    assert any("no readable config.json here" in n for n in notes(problems, "validate"))


def test_unset_shape_without_a_checkpoint_is_a_recipe_error():
    recipe = load_recipe("grpo_tiny_cpu", ["model.hidden_size=null"])
    [p] = check_recipe(recipe)
    assert p.key == "model.hidden_size" and "required when model.hf_checkpoint is not set" in p.message


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    d = _checkpoint(tmp_path)
    (d / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": {"a": 0, "b": 16}}, "added_tokens": [{"id": 40}]})
    )
    problems = check_recipe(load_recipe("grpo_tiny_cpu", [f"model.hf_checkpoint={d}"]))
    assert [p.key for p in problems if p.kind == "recipe"] == ["model.vocab_size"]
    assert "ids up to 40" in problems[0].message


def test_a_malformed_config_json_is_named(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "gpt2"}')
    [p] = check_recipe(load_recipe("grpo_tiny_cpu", [f"model.hf_checkpoint={d}"]))
    assert p.key == "model.hf_checkpoint" and "gpt2" in p.message


def test_prompts_longer_than_the_cap_are_found_by_validate(tmp_path):
    from megatron_rl.models.fixture import build_fixture

    d = build_fixture("qwen2", tmp_path / "qwen2")
    recipe = load_recipe("grpo_tiny_hf_cpu", [f"model.hf_checkpoint={d}"])
    assert check_recipe(recipe) == []
    short = load_recipe(
        "grpo_tiny_hf_cpu", [f"model.hf_checkpoint={d}", "data.max_prompt_tokens=40", "data.prompt_tokens=30"]
    )
    [p] = check_recipe(short)
    assert p.key == "data.max_prompt_tokens" and "prompts are longer" in p.message and p.kind == "recipe"
    assert check_recipe(short, read_data=False) == []  # the planner does not read the data


def _edit(path, **changes):
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "file,changes,phrase",
    [
        ("generation_config.json", {"eos_token_id": "602"}, "eos_token_id must be a token id"),
        ("generation_config.json", {"eos_token_id": [2, None]}, "eos_token_id must be a token id"),
        ("generation_config.json", {"eos_token_id": [2, 100000]}, "past model.vocab_size"),
        ("config.json", {"rope_scaling": "llama3"}, "rope_scaling must be an object"),
        ("config.json", {"vocab_size": "17"}, "vocab_size='17' must be a positive integer"),
        ("config.json", {"hidden_act": "gelu"}, "only SwiGLU"),
        ("config.json", {"use_sliding_window": True}, "sliding-window"),
        ("config.json", {"partial_rotary_factor": 0.5}, "only full RoPE"),
        ("config.json", {"mlp_bias": True}, "MLP biases"),
    ],
)
def test_a_checkpoint_this_project_would_misread_is_refused(tmp_path, file, changes, phrase):
    """What a check could wrongly pass: config values read loosely would train another model, or stop
    the engines at ids the checkpoint never meant."""
    d = _checkpoint(tmp_path)
    _edit(d / file, **changes)
    problems = check_recipe(load_recipe("grpo_tiny_cpu", [f"model.hf_checkpoint={d}"]))
    assert any(p.key == "model.hf_checkpoint" and phrase in p.message for p in problems), problems
    assert refused(problems, "validate")


def test_llama_attention_bias_is_refused(tmp_path):
    cfg = hf_config(LLAMA31_TINY_SCALED).to_dict()
    cfg["attention_bias"] = True  # a bias on o_proj too, which the trainer does not have
    with pytest.raises(ValueError, match="attention_bias"):
        fields_from_config(cfg)


def test_a_unigram_tokenizer_is_sized_by_its_list(tmp_path):
    from megatron_rl.models.resolve import tokenizer_size

    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]] * 30}})
    )
    assert tokenizer_size(tmp_path) == 30


def test_a_chat_template_that_raises_is_a_problem_not_a_traceback(tmp_path):
    from megatron_rl.models.fixture import build_fixture

    d = build_fixture("qwen2", tmp_path / "qwen2")
    (d / "chat_template.jinja").write_text("{{ raise_exception('no chat here') }}")
    tc = d / "tokenizer_config.json"
    data = json.loads(tc.read_text())
    data.pop("chat_template", None)
    tc.write_text(json.dumps(data))
    problems = check_recipe(load_recipe("grpo_tiny_hf_cpu", [f"model.hf_checkpoint={d}"]))
    assert any("chat template fails" in p.message for p in problems), problems
