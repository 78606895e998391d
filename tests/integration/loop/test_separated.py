"""Separated pools end to end (grpo_tiny_cpu_separated: 1 trainer process + 1 engine process).

- sync: the same seeds give colocated-sync's rewards and losses step by step (both train at TP1 with
  one TP1 engine; only where the engine lives differs);
- async (k = 1): every batch's version lag is within k, the engines' sampling versions run one behind,
  the off-policy weights are applied, and the reward climbs;
- async killed with SIGKILL mid-run and resumed: every step trains the prompts the uninterrupted run
  trained (none lost, none twice), whatever the engine had drawn ahead when it died.
"""

import os
import random
import time

import pytest

from tests.helpers.tiny_run import assert_no_alarm, kill_run, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
SEP = "grpo_tiny_cpu_separated"
NO_WANDB = ["logger.wandb=false"]
ASYNC = ["layout.synchrony=async", "rollout.max_staleness=1"]


def _lags(recs):
    return [r["version_lag"]["max"] for r in recs]


@pytest.fixture(scope="module")
def sync_pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("separated_sync")
    # Under the device guard (trainer/device_guard.py): a host object on the NCCL job group, or a device
    # tensor on the gloo one, fails here as it would on GPUs.
    launch(tmp, 4, NO_WANDB, name="separated", recipe=SEP, env={"MEGATRON_RL_DEVICE_GUARD": "1"})
    # The same recipe colocated: one process holds the trainer and the engine.
    colocated = ["layout.placement=colocated", "cluster.gpus_per_node=1"]
    launch(tmp, 4, [*NO_WANDB, *colocated], name="colocated", recipe=SEP)
    # Wider pools: trainer DP2 (two ranks send) and one TP2 engine (a two-rank engine world) in 4 processes.
    wide = ["layout.dp=2", "layout.engine_tp=2", "cluster.gpus_per_node=4", "optim.micro_batch_size=4"]
    launch(tmp, 2, [*NO_WANDB, *wide], name="wide", recipe=SEP)
    assert "device guard installed" in (tmp / "separated.log").read_text()
    return records(tmp, "separated"), records(tmp, "colocated"), records(tmp, "wide")


def test_separated_sync_reproduces_colocated_sync(sync_pair):
    for recs in sync_pair:
        assert_no_alarm(recs)
    sep, col, _ = sync_pair
    assert [r["step"] for r in sep] == [r["step"] for r in col] == [1, 2, 3, 4]
    for a, b in zip(sep, col):
        assert a["prompt_digest"] == b["prompt_digest"]
        assert a["reward"]["mean"] == pytest.approx(b["reward"]["mean"], abs=1e-6), a["step"]
        assert a["train"]["loss"] == pytest.approx(b["train"]["loss"], rel=1e-4, abs=1e-6), a["step"]
        g = a["logprob_agreement"]
        assert g["beyond_threshold"] == [] and g["max_abs_diff"] < 1e-3
        assert a["version_lag"] == {"max": 0, "mean": 0.0, "token_mean": 0.0}
        assert a["logprob_agreement"]["older_version_tokens"] == 0
        assert (a["generation"]["prompts_drawn"], a["generation"]["samples_dropped"]) == (4, 0)
        assert a["publication"]["activated"] and b["publication"]["activated"]
    # separated: the trainer (rank 0) sends every byte to the engine's rank over the job group;
    # colocated, the engine is on the trainer's own rank and the copy is local
    p_sep, p_col = sep[0]["publication"], col[0]["publication"]
    assert p_sep["bytes_local"] == 0 and p_sep["bytes_sent"] == p_col["bytes_local"] > 0
    # the engines' time is in the trainer's record, and the trainer's wait on them beside it
    assert all(r["phases"]["generation"]["seconds"] > 0 and r["rollout_wait_s"] > 0 for r in sep)


def test_wider_pools_publish_and_agree(sync_pair):
    """Trainer DP2 + a TP2 engine: every publication activates on both engine ranks, the engine's
    log-probs agree with the trainer's, and the first step draws the 1 + 1 run's prompts."""
    sep, _, wide = sync_pair
    assert [r["step"] for r in wide] == [1, 2]
    for r in wide:
        assert r["publication"]["activated"] and r["publication"]["bytes_sent"] > 0
        g = r["logprob_agreement"]
        assert g["tokens"] > 0 and g["beyond_threshold"] == [] and g["max_abs_diff"] < 1e-3
    assert wide[0]["prompt_digest"] == sep[0]["prompt_digest"]


@pytest.fixture(scope="module")
def async_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("separated_async")
    steps, save = 10, ["checkpoint.interval=1", "checkpoint.keep_last=3"]
    launch(
        tmp, steps, [*NO_WANDB, *ASYNC, *save], name="A", recipe=SEP, env={"MEGATRON_RL_DEVICE_GUARD": "1"}
    )
    proc = launch(tmp, steps, [*NO_WANDB, *ASYNC, *save], name="B", recipe=SEP, wait=False)
    steps_file = tmp / "outputs" / "B" / "steps.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline:
        if steps_file.exists() and len(steps_file.read_text().splitlines()) >= 3:
            break
        if proc.poll() is not None:
            raise AssertionError("run B ended before it could be killed")
        time.sleep(0.05)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 1.0))
    kill_run(proc)  # the engine rank too, mid-batch or mid-publication
    killed_after = len(steps_file.read_text().splitlines())
    launch(tmp, steps, [*NO_WANDB, *ASYNC, *save], name="B", recipe=SEP)  # resume=auto
    return tmp, steps, killed_after


def test_async_lag_is_within_k_and_the_correction_applies(async_runs):
    tmp, steps, _ = async_runs
    recs = records(tmp, "A")
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert _lags(recs) == [0] + [1] * (steps - 1)  # the first batch is drawn before any update
    # Step s (1-based) trains a batch sampled with version s - 1 (version 1 twice at the start).
    assert [r["version"] for r in recs] == [1, 1] + list(range(2, steps))
    # The last step publishes nothing: no batch is left to draw with it.
    assert recs[-1]["publication"] is None and all(r["publication"]["activated"] for r in recs[:-1])
    assert_no_alarm(recs)  # asynchronous too: every version probed before it served
    # Truncated IS weights pi_old / pi_engine: exactly 1 at lag 0 (the same policy), not 1 after.
    assert recs[0]["train"]["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert any(abs(r["train"]["is_weight_mean"] - 1.0) > 1e-3 for r in recs[1:])
    # The steps overlap: the trainer waits on the engine less than the engine generates and scores.
    later = recs[2:]
    busy = sum(r["phases"]["generation"]["seconds"] + r["phases"]["scoring"]["seconds"] for r in later)
    assert sum(r["rollout_wait_s"] for r in later) < busy


def test_async_reward_climbs(async_runs):
    tmp, steps, _ = async_runs
    rewards = [r["reward"]["mean"] for r in records(tmp, "A")]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.05, rewards


def test_async_kill_and_resume_neither_loses_nor_repeats_prompts(async_runs):
    tmp, steps, killed_after = async_runs
    a = {r["step"]: r for r in records(tmp, "A")}
    b: dict[int, dict] = {}
    for r in records(tmp, "B"):
        b[r["step"]] = r  # a step redone after the resume overwrites the killed run's record
    assert set(b) == set(a) == set(range(1, steps + 1))
    log = (tmp / "B.log").read_text()
    assert "resumed from" in log, "run B did not resume from a checkpoint"
    # The same prompts at every step: those the engine had drawn ahead of the checkpoint are drawn again.
    assert [b[s]["prompt_digest"] for s in sorted(b)] == [a[s]["prompt_digest"] for s in sorted(a)]
    assert all(b[s]["tokens"]["generated"] > 0 for s in b)
    assert max(_lags(b.values())) <= 1
    print(f"killed after {killed_after} step records; every step's prompts match the uninterrupted run")
