"""`megatron-rl validate --json`: one JSON object a script can act on, with the engines' stop ids
resolved from the checkpoint when it is readable here."""

from __future__ import annotations

import json

from megatron_rl.cli import main
from megatron_rl.models.fixture import build_fixture

KEYS = {"ok", "recipe", "problems", "notes", "stop_token_ids", "agreement"}


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


def test_the_agreement_thresholds_in_force_follow_the_dtypes(capsys):
    """fp32 against fp32 agrees to rounding; a bf16 engine's rounding sets looser thresholds; a recipe's own
    threshold replaces the one it sets and says so."""
    _, fp32 = _run(capsys, "grpo_tiny_cpu")
    _, bf16 = _run(capsys, "grpo_tiny_cpu", "rollout.dtype=bf16")
    _, own = _run(capsys, "grpo_tiny_cpu", "rollout.logprob_max_gap=0.25")
    t32, t16 = fp32["agreement"]["thresholds"], bf16["agreement"]["thresholds"]
    assert (t32["trainer_dtype"], t32["engine_dtype"], t32["source"]) == ("fp32", "fp32", "precision")
    assert (t16["trainer_dtype"], t16["engine_dtype"]) == ("fp32", "bf16")
    assert t32["max_gap"] < 1e-3 < t16["max_gap"] and t32["mean_gap"] < t16["mean_gap"]
    assert own["agreement"]["thresholds"]["max_gap"] == 0.25
    assert own["agreement"]["thresholds"]["mean_gap"] == t32["mean_gap"]
    assert own["agreement"]["thresholds"]["source"] == "recipe (max) / precision (mean)"
    assert fp32["agreement"]["action"] == "refuse" and fp32["agreement"]["unguarded"] == []


def test_validate_says_when_the_publication_is_unguarded(capsys):
    _, off = _run(capsys, "grpo_tiny_cpu", "rollout.logprob_probe_prompts=0")
    _, warn = _run(capsys, "grpo_tiny_cpu", "rollout.on_logprob_disagreement=warn")
    assert any("logprob_probe_prompts=0" in u for u in off["agreement"]["unguarded"])
    assert any("reported, never acted on" in u for u in warn["agreement"]["unguarded"])
    rc = main(["validate", "grpo_tiny_cpu", "rollout.logprob_probe_prompts=0"])
    err = capsys.readouterr().err
    assert rc == 0 and "warning: the publication is unguarded: rollout.logprob_probe_prompts=0" in err


def test_a_dtype_pair_without_a_measured_floor_needs_both_thresholds(capsys):
    rc, out = _run(capsys, "grpo_tiny_cpu", "rollout.dtype=fp16", "model.params_dtype=bf16")
    assert rc == 1 and [p["key"] for p in out["problems"]] == ["rollout.logprob_max_gap"]
    rc, out = _run(
        capsys,
        "grpo_tiny_cpu",
        "rollout.dtype=fp16",
        "model.params_dtype=bf16",
        "rollout.logprob_max_gap=0.5",
        "rollout.logprob_mean_gap=0.05",
    )
    assert rc == 0 and out["agreement"]["thresholds"]["source"] == "recipe"
