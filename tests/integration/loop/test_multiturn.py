"""Multi-turn rollouts through the whole loop (rollout/turns.py), in the placements and synchronies a run
can take, on the tiny task and on the HF-format fixture through its real chat template.

- colocated, sync (grpo_tiny_multiturn_cpu, under the device guard): expression feedback;
- separated, async (grpo_tiny_cpu_separated + the same environment): turns on the engine rank, batches a
  version behind;
- HF fixture (grpo_tiny_hf_cpu + code_feedback): each failing program's grader report goes back through
  the fixture's chat template as a user message, and the second turn follows it.

Every step: the trainer's ids equal its engines' ids turn by turn (`token_exact`), the agreement compares
generated tokens only and passes, observations are counted and never trained on. Whether the multi-turn
recipe learns is measured by its 60-step run (`make demo-multiturn`, README), not here."""

from __future__ import annotations

import json

import pytest

from tests.helpers.tiny_run import assert_no_alarm, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
NO_WANDB = ["logger.wandb=false"]
FEEDBACK = [
    "rollout.env=expression_feedback",
    "data.hidden_target=false",
    "rollout.max_turns=3",
    "rollout.turn_max_tokens=6",
    "rollout.max_new_tokens=48",
]
HF = [
    "rollout.env=code_feedback",
    "rollout.max_turns=2",
    "rollout.turn_max_tokens=24",
    "rollout.max_new_tokens=160",
    "rollout.observation_max_tokens=64",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multiturn")
    launch(
        tmp,
        3,
        NO_WANDB,
        name="colocated",
        recipe="grpo_tiny_multiturn_cpu",
        env={"MEGATRON_RL_DEVICE_GUARD": "1"},
    )
    sep = [*NO_WANDB, *FEEDBACK, "layout.synchrony=async", "rollout.max_staleness=1"]
    launch(tmp, 3, sep, name="separated", recipe="grpo_tiny_cpu_separated")
    launch(tmp, 3, [*NO_WANDB, *HF], name="hf", recipe="grpo_tiny_hf_cpu")
    return tmp, {name: records(tmp, name) for name in ("colocated", "separated", "hf")}


def _samples(tmp, name):
    path = tmp / "outputs" / name / "samples.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["colocated", "separated", "hf"])
def test_trainer_ids_equal_engine_ids_and_the_agreement_covers_generated_tokens(runs, name):
    tmp, recs = runs
    assert_no_alarm(recs[name])
    for r in recs[name]:
        assert r["token_exact"] is True, (name, r["step"])
        assert r["turns_max"] >= 2 and r["turns_mean"] > 1.0, (name, r["step"], r["turns_mean"])
        assert r["tokens"]["observation"] > 0 and 0 < r["env_token_fraction"] < 1
        assert r["tokens"]["trained"] == r["tokens"]["generated"]  # observations are context, never trained
        g = r["logprob_agreement"]
        assert g["problems"] == []
        if g["version_lag"] == 0:  # asynchronous: a version behind, the gap measures the update too
            assert g["beyond_threshold"] == [], (name, r["step"], g)
        if r["version_lag"]["max"] == 0 and name != "separated":
            # every generated token of the step is compared, no observation token is (trainer DP 1: rank 0
            # scores every sample; its TP peer scores the same ones)
            assert g["tokens"] == r["tokens"]["generated"], (name, r["step"], g)
        assert r["env_seconds"] > 0


def test_async_separated_trains_a_version_behind(runs):
    _, recs = runs
    assert max(r["version_lag"]["max"] for r in recs["separated"]) == 1


def test_samples_record_their_turns_and_the_console_reports_them(runs):
    tmp, recs = runs
    kept = _samples(tmp, "colocated")
    assert kept and all("turns" in s and s["turns"] >= 1 for s in kept)
    console = (tmp / "colocated.log").read_text()
    assert "multi-turn:" in console and "trainer ids = engine ids on every step" in console, console[-3000:]


def test_the_hf_path_renders_feedback_through_the_chat_template(runs):
    tmp, _ = runs
    second = [s for s in _samples(tmp, "hf") if s["turns"] == 2]
    assert second, "no sample took a second turn"
    s = second[0]
    assert "<|im_start|>user\nYour program did not pass" in s["completion"], s["completion"][-600:]
    # after the feedback message, the template's assistant header: the second turn follows it
    assert "<|im_start|>assistant\n" in s["completion"].split("Your program did not pass", 1)[1]
