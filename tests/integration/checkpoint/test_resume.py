"""Checkpoint, resume and export on the tiny recipe (real megatron-core dist-checkpointing, real loop).

- A: 4 steps uninterrupted, saving every step (conftest.py's `uninterrupted`, shared with
  test_resume_integrity.py).
- B: the same run killed with SIGKILL (whole process group) at a random moment after step 2's
  record appears -- in step 3, or in the middle of step 2's or 3's save -- then resumed with
  checkpoint.resume=auto and finished. Its records of the steps after the resume point must equal
  A's, bit for bit, in every deterministic field.
- A's TP2 checkpoint resumed at TP1 x PP2 for one more step, and exported to HF at both layouts.
"""

import json
import math
import os
import random
import time

import pytest
import torch

from tests.helpers.launch import torchrun
from tests.helpers.tiny_run import RESUME_STEPS, SAVE_EVERY_STEP, kill_run, launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
N = RESUME_STEPS // 2  # A (conftest.py's `uninterrupted`) and B run 2N steps
SAVE = SAVE_EVERY_STEP


def deterministic(rec: dict) -> dict:
    """Everything in a step record that does not depend on wall time or memory."""
    return {
        "step": rec["step"],
        "version": rec["version"],
        "reward": rec["reward"],
        "tokens": rec["tokens"],
        "train": rec["train"],
        "agreement": {k: rec["logprob_agreement"][k] for k in ("mean_abs_diff", "max_abs_diff", "tokens")},
    }


@pytest.fixture(scope="module")
def runs(uninterrupted):
    """A (conftest.py's `uninterrupted`) and B, killed and resumed, in the same folder."""
    tmp = uninterrupted
    proc = launch(tmp, 2 * N, SAVE, name="B", wait=False)
    steps_file = tmp / "outputs" / "B" / "steps.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline:
        # a complete checkpoint to resume from (an asynchronous save completes after the step's record:
        # under load, step 1's could still be in flight when step 2's record appears)
        ready = (tmp / "ckpt" / "B" / f"step_{N - 1:06d}").is_dir()
        if ready and steps_file.exists() and len(steps_file.read_text().splitlines()) >= N:
            break
        if proc.poll() is not None:
            raise AssertionError("run B ended before it could be killed")
        time.sleep(0.05)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 2.5))
    kill_run(proc)  # the ranks too: torchrun puts each in a session of its own
    killed_after = len(steps_file.read_text().splitlines())
    launch(tmp, 2 * N, SAVE, name="B")  # resume=auto
    return tmp, killed_after


def _wandb_ids(tmp, name: str) -> set[str]:
    """The W&B run ids of a run's offline folders (offline-run-<time>-<id>)."""
    return {p.name.rsplit("-", 1)[1] for p in (tmp / "outputs" / name / "wandb").glob("offline-run-*")}


def test_resumed_run_equals_uninterrupted_run(runs):
    tmp, killed_after = runs
    a = {r["step"]: r for r in records(tmp, "A")}
    b: dict[int, dict] = {}
    for r in records(tmp, "B"):
        b[r["step"]] = r  # a step redone after the resume overwrites the killed run's record
    assert set(b) == set(a) == set(range(1, 2 * N + 1))
    log = (tmp / "B.log").read_text()
    assert "resumed from" in log, "run B did not resume from a checkpoint"
    # One W&B run however often it starts: the killed start's folder and the resumed one's share its id.
    [wandb_id] = _wandb_ids(tmp, "B")
    assert len(list((tmp / "outputs" / "B" / "wandb").glob("offline-run-*"))) == 2
    assert f"W&B continues run {wandb_id}, offline" in log
    for step in range(N + 1, 2 * N + 1):
        assert deterministic(b[step]) == deterministic(a[step]), f"step {step} differs after resume"
    print(f"killed after {killed_after} step records; steps {N + 1}..{2 * N} identical")


def test_incomplete_checkpoint_is_skipped(runs, tmp_path):
    """A checkpoint directory without its marker is never loaded."""
    from megatron_rl.checkpoint.store import newest_complete

    tmp, _ = runs
    root = tmp / "ckpt" / "A"
    newest = newest_complete(root)
    assert newest is not None and newest[0] == 2 * N
    marker = (newest[1] / "COMPLETE").read_bytes()
    (newest[1] / "COMPLETE").unlink()
    older = newest_complete(root)
    assert older is not None and older[0] == 2 * N - 1
    (newest[1] / "COMPLETE").write_bytes(marker)  # A's checkpoints serve the tests after this one


def test_save_at_tp2_resume_at_tp1_pp2(runs):
    tmp, _ = runs
    launch(
        tmp,
        2 * N + 1,
        [*SAVE, "layout.tp=1", "layout.pp=2", f"checkpoint.resume={tmp}/ckpt/A/step_{2 * N:06d}"],
        name="C",
    )
    recs = records(tmp, "C")
    assert [r["step"] for r in recs] == [2 * N + 1], "C must resume at step 2N and run one step"
    # Another run's checkpoint under a name of its own: a W&B run of its own, not A's continued.
    assert len(_wandb_ids(tmp, "C")) == 1 and _wandb_ids(tmp, "C") != _wandb_ids(tmp, "A")
    assert recs[0]["logprob_agreement"]["max_abs_diff"] < 1e-3
    assert recs[0]["version"] == 2 * N + 1
    # rank 0, on the first of two stages, computed no loss: the record has the last stage's, all of it
    train = recs[0]["train"]
    assert {"loss", "pg_loss", "clip_fraction", "ratio_mean", "grad_norm", "lr"} <= set(train), train
    assert all(math.isfinite(v) for v in train.values()), train


def test_export_hf_gives_trainer_logits_at_both_layouts(runs):
    from transformers import AutoModelForCausalLM

    tmp, _ = runs
    step = tmp / "ckpt" / "A" / f"step_{2 * N:06d}"
    exported = {}
    for name, overrides in {"tp2": [], "tp1pp2": ["layout.tp=1", "layout.pp=2"]}.items():
        out = tmp / f"export_{name}"
        torchrun("tests/integration/checkpoint/worker_export.py", 2, [str(step), str(out), *overrides])
        model = AutoModelForCausalLM.from_pretrained(out / "hf", dtype=torch.float32).eval()
        ref = torch.load(out / "trainer_logprobs.pt")
        err = 0.0
        for s, p, lp in zip(ref["seqs"], ref["plens"], ref["logprobs"]):
            with torch.no_grad():
                logits = model(torch.tensor([s])).logits[0]
            hf = torch.log_softmax(logits.float(), -1)[torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:])]
            err = max(err, (hf - lp).abs().max().item())
        assert err < 1e-5, f"{name}: HF export disagrees with the trainer by {err:.2e}"
        from safetensors.torch import load_file

        exported[name] = load_file(out / "hf" / "model.safetensors")
    assert exported["tp2"].keys() == exported["tp1pp2"].keys()
    for k in exported["tp2"]:
        assert torch.equal(exported["tp2"][k], exported["tp1pp2"][k]), k
    meta = json.loads((step / "run_state.json").read_text())
    assert meta["step"] == 2 * N and meta["layout"]["tp"] == 2
