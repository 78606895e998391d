"""Keys as typed on the command line: an open mapping's entries need no `+`, a mistyped key is answered
with the keys it probably meant (config/keys.py)."""

from __future__ import annotations

import json

import pytest

from megatron_rl.cli import main
from megatron_rl.config.keys import nearest, open_mappings
from megatron_rl.config.load import RecipeError, load_recipe


def test_data_columns_entries_as_the_readme_writes_them():
    assert open_mappings() == ("data.columns",)
    assert load_recipe("grpo_tiny_cpu", ["data.columns.prompt=text"]).data.columns == {"prompt": "text"}
    assert load_recipe("grpo_tiny_cpu", ["+data.columns.prompt=text"]).data.columns == {"prompt": "text"}
    both = load_recipe("grpo_tiny_cpu", ["data.columns.prompt=text", "data.columns.tests=test_list"])
    assert both.data.columns == {"prompt": "text", "tests": "test_list"}
    # An entry given twice (or set by the recipe, then on the command line): the later one wins.
    again = load_recipe("grpo_tiny_cpu", ["+data.columns.prompt=a", "+data.columns.prompt=b"])
    assert again.data.columns == {"prompt": "b"}
    assert load_recipe("grpo_tiny_cpu", ["data.columns={prompt: q}"]).data.columns == {"prompt": "q"}


def test_a_user_dataset_through_validate_with_its_columns_mapped(tmp_path, capsys):
    """The journey's first step: five MBPP-shaped rows under columns of their own, mapped on the command
    line, read by `validate` through the checkpoint's tokenizer."""
    rows = [
        {"n": i, "question": f"Write add{i}(a, b).", "checks": [f"assert add{i}(1, 2) == 3"]}
        for i in range(5)
    ]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mapped = ["data.columns.id=n", "data.columns.prompt=question", "data.columns.tests=checks"]
    rc = main(["validate", "grpo_tiny_hf_cpu", f"data.source={data}", *mapped])
    assert rc == 0, capsys.readouterr().err
    rc = main(["validate", "grpo_tiny_hf_cpu", f"data.source={data}"])
    err = capsys.readouterr().err
    assert rc == 1 and "missing required key 'prompt'" in err and "data.columns.prompt=question" in err


@pytest.mark.parametrize(
    "typed, meant",
    [
        ("optim.lrr", ["optim.lr", "optim.min_lr"]),
        ("optim.minibatches", ["algorithm.minibatches"]),  # the right name in another group
        ("rollout.temperatur", ["rollout.temperature"]),
        ("rollout.sample_per_prompt", ["rollout.samples_per_prompt"]),
        ("rollouts", ["rollout"]),
        ("micro_batch_size", ["critic.micro_batch_size", "optim.micro_batch_size"]),  # both groups have one
        ("zzz", []),
    ],
)
def test_nearest_keys(typed, meant):
    assert nearest(typed) == meant


def test_an_unknown_key_gets_did_you_mean_on_the_command_line_and_in_a_file(tmp_path):
    with pytest.raises(RecipeError, match=r"optim\.minibatches.*\(did you mean algorithm\.minibatches\?\)"):
        load_recipe("grpo_tiny_cpu", ["optim.minibatches=2"])
    with pytest.raises(RecipeError, match=r"unknown config key 'optim\.lrr' \(did you mean optim\.lr or"):
        load_recipe("grpo_tiny_cpu", ["+optim.lrr=1"])
    typo = tmp_path / "typo.yaml"
    typo.write_text("defaults:\n  - /base\n  - _self_\nname: typo\nrollout:\n  temperatur: 0.7\n")
    with pytest.raises(RecipeError, match=r"\(did you mean rollout\.temperature\?\)"):
        load_recipe(str(typo))
    with pytest.raises(RecipeError) as e:  # nothing close: no guess
        load_recipe("grpo_tiny_cpu", ["zzz=1"])
    assert "did you mean" not in str(e.value)
