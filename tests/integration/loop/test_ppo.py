"""PPO with a critic and a learned reward model, through the whole loop (real megatron-core, vLLM CPU engines,
the sandbox), sharing three launched runs of ppo_tiny_cpu:

- A: 4 steps, the critic at a layout of its own (critic.tp=1: TP1 x DP2 beside the trainer's TP2 x DP1,
  trainer/model_groups.py), a checkpoint after every step, the first step critic-only, two passes over the minibatches,
  and a random reward model (a tiny Qwen2 sequence classifier over the synthetic task's 17 tokens) whose
  score joins the sandbox's at weight 0.1;
- B: the same run killed with SIGKILL after step 2's record, then resumed: steps 3 and 4 equal A's bit for
  bit, the critic's loss, explained variance and the reward model's scores included (the checkpoint
  carries the critic, its optimizer and its LR schedule, at the critic's own layout);
- C: 2 steps with the critic at the trainer's layout (the recipe's), sharing megatron-core's global groups;
- D: 2 steps with the critic in two pipeline stages (critic.tp=1, critic.pp=2: TP1 x PP2 x DP1), whose
  first stage (rank 0, which writes the record) computes no loss of its own.
"""

from __future__ import annotations

import json
import math
import time

import pytest

from megatron_rl.models.tiny import tiny_spec, write_hf_reward_model
from tests.helpers.tiny_run import kill_run, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = 4
RM_WEIGHT = 0.1
PPO_KEYS = (
    "value_loss",
    "explained_variance",
    "critic_grad_norm",
    "returns_mean",
    "values_mean",
    "reward_model_mean",
)


def _extra(rm) -> list[str]:
    return [
        "checkpoint.interval=1",
        "checkpoint.keep_last=5",
        "checkpoint.async_save=true",
        "critic.critic_only_steps=1",
        "critic.epochs=0",  # the policy's passes (algorithm.epochs=2), not the recipe's four
        "critic.tp=1",
        "critic.micro_batch_size=4",
        "algorithm.epochs=2",
        f"reward.model_checkpoint={rm}",
        f"reward.model_weight={RM_WEIGHT}",
        "logger.wandb=false",
    ]


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppo")
    rm = write_hf_reward_model(
        tiny_spec(vocab_size=17, hidden_size=128, num_attention_heads=2, num_query_groups=2, num_layers=1,
                  ffn_hidden_size=256),
        tmp / "rm", seed=5,
    )  # fmt: skip
    launch(tmp, STEPS, _extra(rm), name="A", recipe="ppo_tiny_cpu")
    proc = launch(tmp, STEPS, _extra(rm), name="B", recipe="ppo_tiny_cpu", wait=False)
    # killed once step 2's checkpoint is complete (its folder renamed into place), so the resume has one
    saved = tmp / "ckpt" / "B" / "step_000002"
    deadline = time.time() + 600
    while not saved.is_dir():
        assert proc.poll() is None and time.time() < deadline, "run B ended (or hung) before it was killed"
        time.sleep(0.05)
    kill_run(proc)
    launch(tmp, STEPS, _extra(rm), name="B", recipe="ppo_tiny_cpu")  # resume=auto
    c = ["logger.wandb=false", "checkpoint.interval=0", "critic.critic_only_steps=1"]
    launch(tmp, 2, c, name="C", recipe="ppo_tiny_cpu")
    launch(tmp, 2, [*c, "critic.tp=1", "critic.pp=2"], name="D", recipe="ppo_tiny_cpu")
    return tmp


def _deterministic(rec: dict) -> dict:
    return {
        "reward": rec["reward"],
        "train": rec["train"],
        "tokens": rec["tokens"],
        **{k: rec[k] for k in PPO_KEYS},
        "agreement": {k: rec["logprob_agreement"][k] for k in ("mean_abs_diff", "max_abs_diff")},
    }


def test_every_step_records_the_critic_and_the_reward_model(ppo_runs):
    recs = records(ppo_runs, "A")
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    for r in recs:
        assert all(math.isfinite(r[k]) for k in PPO_KEYS), {k: r.get(k) for k in PPO_KEYS}
        assert r["critic_lr"] > 0 and r["value_loss"] > 0
        for phase in ("reward_model", "critic_values", "critic_train"):
            assert r["phases"][phase]["seconds"] > 0, (r["step"], phase)
    # the first step trains the critic only (critic.critic_only_steps=1): no policy update, the agreement
    # checked by a forward of its own; every later step updates both, twice over 2 minibatches (epochs=2)
    assert recs[0]["train"] == {} and recs[0]["logprob_agreement"]["tokens"] > 0
    assert all("loss" in r["train"] and r["old_logprobs"] == "recompute" for r in recs[1:])


def test_the_critic_at_its_own_layout_and_at_the_trainers(ppo_runs):
    """A's critic ran at TP1 x DP2 on its own groups (the log says so at start-up), D's at TP1 x PP2; C's at
    the trainer's TP2, on megatron-core's global groups: each records the critic's keys, and each critic moved
    from the fresh head's zeros by step 2."""
    log = (ppo_runs / "A.log").read_text()
    assert "critic: tp=1 pp=1 dp=2 (its own layout" in log, log[-3000:]
    assert "its own layout" not in (ppo_runs / "C.log").read_text()
    assert "critic: tp=1 pp=2 dp=1 (its own layout" in (ppo_runs / "D.log").read_text()
    for name in ("A", "C", "D"):
        recs = records(ppo_runs, name)
        # the whole minibatch's loss, summed over the critic's DP ranks and stages, on the recording rank too
        assert all(r["value_loss"] > 0 and r["critic_grad_norm"] > 0 for r in recs), name
        assert recs[0]["values_mean"] == 0.0, "a fresh value head predicts 0"
        assert recs[1]["values_mean"] != 0.0, f"{name}: the critic did not move"


def test_the_reward_is_the_verifiers_plus_the_weighted_model_score(ppo_runs):
    seen = 0
    for line in (ppo_runs / "outputs" / "A" / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        verifier = s["reward"] - RM_WEIGHT * s["model_score"]
        # the synthetic task's verifier gives a fraction of its tests (reward.mode=fraction): k / n, n <= 4
        assert min(abs(verifier * n - round(verifier * n)) for n in (1, 2, 3, 4)) < 1e-5, s
        assert s["model_score"] != 0.0  # a random score head scores every sequence
        seen += 1
    assert seen >= STEPS


def test_a_killed_ppo_run_resumes_bit_exact_with_its_critic(ppo_runs):
    a = {r["step"]: r for r in records(ppo_runs, "A")}
    b: dict[int, dict] = {}
    for r in records(ppo_runs, "B"):
        b[r["step"]] = r
    assert set(b) == set(a)
    log = (ppo_runs / "B.log").read_text()
    assert "resumed from" in log and ("at step 2" in log or "at step 3" in log), log[-2000:]
    for step in (3, 4):
        assert _deterministic(b[step]) == _deterministic(a[step]), f"step {step} differs after the resume"
    state = json.loads(next((ppo_runs / "ckpt" / "A").glob("step_000004/run_state.json")).read_text())
    assert state["critic"] is True and state["algorithm"] == "ppo"
