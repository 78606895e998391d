"""`megatron-rl validate --json`: one JSON object a script can act on, with the engines' stop ids
resolved from the checkpoint when it is readable here."""

from __future__ import annotations

import json

from megatron_rl.cli import main
from megatron_rl.models.fixture import build_fixture

KEYS = {"ok", "recipe", "problems", "notes", "stop_token_ids"}


def _run(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["validate", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_valid_recipe_without_checkpoint(capsys):
    rc, out = _run(capsys, "grpo_tiny_cpu")
    assert rc == 0 and set(out) == KEYS
    assert out["ok"] is True and out["recipe"] == "grpo_tiny_cpu" and out["problems"] == []
    assert out["stop_token_ids"] is None  # no model.hf_checkpoint


def test_stop_ids_are_the_recipe_ids_and_the_checkpoint_end_ids(capsys, tmp_path):
    d = build_fixture("qwen2", tmp_path / "qwen2")
    rc, out = _run(capsys, "grpo_tiny_cpu", f"model.hf_checkpoint={d}", "rollout.stop_token_ids=[5,600]")
    # im_end (602) and endoftext (600) from the checkpoint, 5 from the recipe: sorted, each once.
    assert out["stop_token_ids"] == [5, 600, 602]
    # The tiny recipe's own shape disagrees with the fixture's: refused, each problem structured.
    assert rc == 1 and out["ok"] is False and out["problems"]
    assert all(set(p) == {"key", "value", "message", "kind"} for p in out["problems"])


def test_unreadable_checkpoint_gives_null_stop_ids_and_a_note(capsys, tmp_path):
    rc, out = _run(capsys, "grpo_tiny_cpu", f"model.hf_checkpoint={tmp_path / 'absent'}")
    assert out["stop_token_ids"] is None
    assert any("model.hf_checkpoint" in n for n in out["notes"]) or any(
        p["key"] == "model.hf_checkpoint" for p in out["problems"]
    )


def test_unknown_recipe_is_a_json_refusal(capsys):
    rc, out = _run(capsys, "no_such_recipe")
    assert rc == 2 and out["ok"] is False and out["recipe"] is None
    assert out["problems"][0]["key"] == "recipe" and "no_such_recipe" in out["problems"][0]["message"]
