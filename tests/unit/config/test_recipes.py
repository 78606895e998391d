"""Every shipped recipe composes and validates; bad configs are refused with their documented message."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rl.check.recipe import ConfigError, validate_recipe
from megatron_rl.config.load import RECIPES_DIR, RecipeError, load_recipe, shipped_recipes

EXPECTED_RECIPES = 11  # bump when a recipe is added: the glob below must find exactly these


def test_recursive_glob_finds_every_recipe():
    found = sorted(RECIPES_DIR.rglob("*.yaml"))
    assert len(found) == EXPECTED_RECIPES, [p.name for p in found]
    assert set(shipped_recipes()) >= {
        "grpo_tiny_cpu",
        "grpo_qwen2.5-32b_32n8g",
        "grpo_llama3.1-70b_8n8g",
        "grpo_qwen2.5-7b_1n8g",
        "grpo_tiny_hf_cpu",
        "grpo_tiny_cpu_separated",
        "grpo_qwen3-30b-a3b_4n8g",
        "grpo_tiny_moe_cpu",
    }


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_recipe_composes_and_validates(name):
    recipe = load_recipe(name)
    assert recipe.name == name, "a recipe's name field must equal its file name"
    validate_recipe(recipe, "validate")  # the GPU recipes' checkpoints live on the cluster's storage
    first = Path(shipped_recipes()[name]).read_text().splitlines()[0]
    assert first.startswith("# Launch: "), "every recipe starts with the exact command that launches it"


def test_reference_recipe_numbers():
    r = load_recipe("grpo_qwen2.5-32b_32n8g")
    assert (r.model.num_layers, r.model.hidden_size, r.model.num_query_groups, r.model.head_dim) == (
        64,
        5120,
        8,
        128,
    )
    assert (r.data.prompts_per_step, r.rollout.samples_per_prompt, r.algorithm.minibatches) == (512, 8, 4)
    assert (r.cluster.nodes, r.cluster.gpus_per_node, r.reward.pool_cores) == (32, 8, 1024)
    assert r.algorithm.kl_coef > 0 and r.steps == 600 and r.plan.target_hours == 48


# (overrides, key named in the error, a phrase of the documented message)
BAD = [
    (["layout.tp=4"], "layout.tp", "KV groups < TP is not supported by the trainer"),
    (["layout.pp=3"], "layout.pp", "explicit uneven split"),
    (["layout.pp=2", "layout.pp_layers=[1,2]"], "layout.pp_layers", "summing to model.num_layers"),
    (["layout.dp=2"], "layout.dp", "must equal cluster.nodes x cluster.gpus_per_node"),
    (["layout.engine_tp=2", "layout.engine_count=2"], "layout.engine_count", "engine ranks exceed"),
    (["layout.engine_count=1"], "layout.engine_count", "must cover the 2 GPUs"),
    (["layout.engine_tp=4", "layout.engine_count=1"], "layout.engine_tp", "must fit inside a node"),
    (["layout.engine_tp=3"], "layout.engine_tp", "must divide model.num_attention_heads"),
    (["algorithm.minibatches=3"], "algorithm.minibatches", "must divide the 64 samples"),
    (["rollout.samples_per_prompt=1"], "rollout.samples_per_prompt", "GRPO needs >= 2"),
    (["rollout.max_new_tokens=300"], "rollout.max_new_tokens", "exceeds model.max_position_embeddings"),
    (["algorithm.loss_agg=sum"], "algorithm.loss_agg", "must be one of"),
    (["algorithm.kl_estimator=k4"], "algorithm.kl_estimator", "must be one of"),
    (["model.num_query_groups=3"], "model.num_query_groups", "must divide model.num_attention_heads"),
    (["rollout.temperature=0"], "rollout.temperature", "> 0 (log-probs are taken at this temperature)"),
    (["layout.placement=remote"], "layout.placement", "must be one of"),
]


@pytest.mark.parametrize("overrides,key,phrase", BAD, ids=[b[1] + ":" + b[0][0] for b in BAD])
def test_bad_config_refused_with_message(overrides, key, phrase):
    recipe = load_recipe("grpo_tiny_cpu", overrides)
    with pytest.raises(ConfigError) as e:
        validate_recipe(recipe)
    msgs = [str(p) for p in e.value.problems if p.key == key]
    assert msgs, f"no problem reported for {key}: {e.value}"
    assert any(phrase in m for m in msgs), msgs


def test_big_recipe_that_does_not_fit_memory_is_refused():
    pytest.importorskip("megatron_rl.plan.memory")
    recipe = load_recipe("grpo_qwen2.5-32b_32n8g", ["layout.tp=1", "layout.pp=1", "layout.dp=256"])
    with pytest.raises(ConfigError, match="exceeds cluster.gpu_memory_gib"):
        validate_recipe(recipe)


def test_unknown_key_and_wrong_type_fail_at_load(tmp_path):
    with pytest.raises(RecipeError, match="layout.tpp"):
        load_recipe("grpo_tiny_cpu", ["layout.tpp=2"])
    with pytest.raises(RecipeError, match="layout.tpp"):
        load_recipe("grpo_tiny_cpu", ["+layout.tpp=2"])
    # The reason, not only Hydra's "Error merging override".
    with pytest.raises(RecipeError, match="layout.tp=two.*could not be converted to Integer"):
        load_recipe("grpo_tiny_cpu", ["layout.tp=two"])
    typo = tmp_path / "typo.yaml"
    typo.write_text("defaults:\n  - /base\n  - _self_\nname: typo\nrollout:\n  temperatur: 0.7\n")
    with pytest.raises(RecipeError, match="temperatur"):
        load_recipe(str(typo))


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "megatron_rl.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_cp_copy_runs_even_under_the_shipped_name(tmp_path):
    assert _cli("cp", "grpo_tiny_cpu", str(tmp_path)).returncode == 0
    copy = tmp_path / "grpo_tiny_cpu.yaml"
    shipped_steps = load_recipe("grpo_tiny_cpu").steps
    edited = re.sub(r"(?m)^steps: \d+$", "steps: 7", copy.read_text())
    assert edited != copy.read_text(), "the recipe has no top-level steps line to edit"
    copy.write_text(edited)
    assert load_recipe(str(copy)).steps == 7
    assert load_recipe("grpo_tiny_cpu").steps == shipped_steps != 7
    shown = _cli("show", str(copy), "seed=5")
    assert shown.returncode == 0 and "steps: 7" in shown.stdout and "seed: 5" in shown.stdout
    again = _cli("cp", "grpo_tiny_cpu", str(tmp_path))
    assert again.returncode == 1 and "--force" in again.stderr


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_cp_rewrites_the_launch_comment_to_launch_the_copy(name, tmp_path, monkeypatch, capsys):
    from megatron_rl.cli.recipes import cp
    from megatron_rl.config.load import resolve_recipe

    monkeypatch.chdir(tmp_path)
    assert cp([name, "mine"]) == 0
    copy = tmp_path / "mine" / f"{name}.yaml"
    text, shipped = copy.read_text(), shipped_recipes()[name].read_text()
    head = text.splitlines()[0]
    command = re.fullmatch(r"# Launch: megatron-rl (run|submit) (\S+)( .*)?", head)
    assert command, head  # `make demo` launches the shipped recipe, never the copy
    assert resolve_recipe(command.group(2)) == copy.resolve()
    comment = [line for line in text.splitlines() if line.startswith("#   (=") or line.startswith("#    =")]
    assert all(f"mine/{name}.yaml" in line for line in comment), comment
    # Below the launch comment, the copy is the shipped recipe, byte for byte.
    assert shipped.endswith(text.split("\n", len(comment) + 1)[-1])


def test_validate_cli_reports_every_problem():
    proc = _cli("validate", "grpo_tiny_cpu", "layout.tp=4", "rollout.temperature=0")
    assert proc.returncode == 1
    assert "layout.tp=4" in proc.stderr and "rollout.temperature=0" in proc.stderr
    assert _cli("validate", "no_such_recipe").returncode == 2
