"""kill -9 in the middle of an asynchronous save, then resume: the run takes the previous verified
checkpoint and reproduces the uninterrupted run bit for bit from there (the tiny recipe, real loop).

- A: 4 steps uninterrupted, saving every step (async; conftest.py's `uninterrupted`, shared with
  test_resume.py).
- B: the same run, killed (SIGKILL to the whole process group) as soon as the save of step >= 2 has
  started (its `step_N.partial` directory appears), then resumed with checkpoint.resume=auto.
The records of B after its resume point must equal A's in every deterministic field.
"""

import time

import pytest

from megatron_rl.checkpoint.integrity import verify
from megatron_rl.checkpoint.store import list_checkpoints, partial_dir, step_dir
from tests.helpers.tiny_run import RESUME_STEPS, SAVE_EVERY_STEP, kill_run, launch, records
from tests.integration.checkpoint.test_resume import deterministic

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = RESUME_STEPS
SAVE = SAVE_EVERY_STEP  # asynchronous saves


def _kill_during_save(tmp, proc) -> tuple[int, bool]:
    """SIGKILL once a save of step >= 2 is in flight; returns (that step, whether its files were all hashed)."""
    root = tmp / "ckpt" / "B"
    deadline = time.time() + 600
    while time.time() < deadline:
        for step in range(2, STEPS + 1):
            work = partial_dir(root, step)
            if work.is_dir():
                assert kill_run(proc) >= 3, "the launcher, torchrun and the ranks must all be killed"
                return step, len(list(work.glob("sums_rank_*.json"))) == 2
        if proc.poll() is not None:
            raise AssertionError("run B ended before a save could be interrupted")
        time.sleep(0.005)
    raise AssertionError("no save of step >= 2 started within the deadline")


@pytest.fixture(scope="module")
def runs(uninterrupted, tmp_path_factory):
    """B, killed during a save and resumed, in a folder of its own; A's records."""
    tmp = tmp_path_factory.mktemp("kill_async")
    proc = launch(tmp, STEPS, SAVE, name="B", wait=False)
    killed_in, hashed = _kill_during_save(tmp, proc)
    root = tmp / "ckpt" / "B"
    steps_file = tmp / "outputs" / "B" / "steps.jsonl"
    written = steps_file.read_text() if steps_file.exists() else ""
    time.sleep(3.0)  # a rank that survived the kill would go on writing records and checkpoints
    left = {
        "partial": partial_dir(root, killed_in).is_dir(),
        "complete": [s for s, _ in list_checkpoints(root)],
        "records_at_kill": len(written.splitlines()),
        "still_running": (steps_file.read_text() if steps_file.exists() else "") != written,
    }
    launch(tmp, STEPS, SAVE, name="B")  # resume=auto
    return tmp, killed_in, hashed, left, records(uninterrupted, "A")


def test_the_interrupted_save_left_no_checkpoint(runs):
    _, killed_in, _, left, _ = runs
    assert not left["still_running"] and left["records_at_kill"] < STEPS
    assert left["partial"] and killed_in not in left["complete"]
    assert max(left["complete"]) == killed_in - 1


def test_resume_takes_the_previous_verified_step_and_reproduces_the_run(runs):
    tmp, killed_in, hashed, _, a_records = runs
    log = (tmp / "B.log").read_text()
    previous = step_dir(tmp / "ckpt" / "B", killed_in - 1)
    assert f"resumed from {previous} at step {killed_in - 1}" in log
    a = {r["step"]: r for r in a_records}
    b: dict[int, dict] = {}
    for r in records(tmp, "B"):
        b[r["step"]] = r  # a step redone after the resume overwrites the killed run's record
    assert set(b) == set(a) == set(range(1, STEPS + 1))
    for step in range(killed_in, STEPS + 1):
        assert deterministic(b[step]) == deterministic(a[step]), f"step {step} differs after resume"
    assert all(r["publication"]["refused"] == [] and r["publication"]["attempts"] == 1 for r in a.values())
    print(
        f"killed during the save of step {killed_in} (background hashing done: {hashed}); resumed at {killed_in - 1}"
    )


def test_after_the_resumed_run_every_checkpoint_verifies_and_no_partial_is_left(runs):
    tmp, _, _, _, _ = runs
    root = tmp / "ckpt" / "B"
    assert [s for s, _ in list_checkpoints(root)] == list(range(1, STEPS + 1))
    assert all(verify(p) == [] for _, p in list_checkpoints(root))
    assert not list(root.glob("*.partial"))
