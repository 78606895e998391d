"""Fault injection on real megatron-core checkpoints (TP2, gloo): resume takes the newest checkpoint
that verifies and loads exactly its weights; a full disk is named as such (sync and async saves).

The checkpoints come from worker_integrity.py (steps 1 and 2 saved asynchronously, 3 synchronously);
each test damages a copy. Weights are compared through per-rank digests of the loaded parameters. The
loads (and the full disks) of several tests run as jobs of one torchrun (`batch`: a fresh policy per
job), prepared by a module fixture; each test then checks its own job.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_rl.checkpoint.integrity import verify
from megatron_rl.checkpoint.resume import find
from megatron_rl.checkpoint.store import list_checkpoints, prune, step_dir
from tests.helpers.launch import torchrun

pytestmark = pytest.mark.slow
WORKER = "tests/integration/checkpoint/worker_integrity.py"


def _result(proc) -> dict:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _batch(jobs: dict[str, list[str]], folder: Path, timeout: float = 600) -> dict:
    """Run every job (id -> MODE ROOT [...]) in one torchrun; {id: its result}."""
    spec = folder / "jobs.json"
    spec.write_text(json.dumps([{"id": k, "args": v} for k, v in jobs.items()]))
    return _result(torchrun(WORKER, 2, ["batch", str(spec)], timeout=timeout))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity") / "pristine"
    return root, _result(torchrun(WORKER, 2, ["save", str(root)]))


@pytest.fixture(scope="module")
def saved(saved_run):
    """The checkpoints' root and each step's per-rank weight digests."""
    root, out = saved_run
    return root, {int(k): v for k, v in out.items() if k != "lr"}


def _copy(saved, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(saved[0], root)
    return root


def _flip64(path):
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 64] = bytes(b ^ 0xFF for b in raw[mid : mid + 64])
    path.write_bytes(bytes(raw))


FAULTS = {
    "missing rank shard": (lambda d: (d / "dist" / "__1_0.distcp").unlink(), "dist/__1_0.distcp: missing"),
    "truncated shard": (
        lambda d: os.truncate(d / "dist" / "__0_1.distcp", 4096),
        "dist/__0_1.distcp: 4096 bytes",
    ),
    "empty .metadata": (lambda d: os.truncate(d / "dist" / ".metadata", 0), "dist/.metadata: 0 bytes"),
    "64 flipped bytes": (
        lambda d: _flip64(d / "dist" / "__1_1.distcp"),
        "dist/__1_1.distcp: checksum mismatch",
    ),
}


def test_every_saved_checkpoint_verifies_with_every_file_listed(saved):
    root, _ = saved
    assert [s for s, _ in list_checkpoints(root)] == [1, 2, 3]
    for _, path in list_checkpoints(root):
        assert verify(path) == []
        files = json.loads((path / "MANIFEST.json").read_text())["files"]
        on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
        assert set(files) == on_disk - {"MANIFEST.json", "COMPLETE"}
        assert {"dist/.metadata", "dist/common.pt", "rank_00000.pt", "rank_00001.pt"} <= set(files)
    assert not list(root.glob("*.partial"))


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_newest_checkpoint_is_skipped_with_its_reason(saved, tmp_path, caplog, fault):
    damage, message = FAULTS[fault]
    root = _copy(saved, tmp_path)
    damage(step_dir(root, 3))
    assert find("auto", root) == step_dir(root, 2)
    assert f"skipping checkpoint {step_dir(root, 3)}" in caplog.text and message in caplog.text
    with pytest.raises(SystemExit, match=f"does not verify:\n  {message}"):
        find(str(step_dir(root, 3)), root)
    cli = Path(sys.executable).with_name("megatron-rl")  # the installed entry point
    assert subprocess.run([str(cli), "ckpt", "verify", str(root)], capture_output=True).returncode == 1


@pytest.fixture(scope="module")
def resumed(saved, tmp_path_factory):
    """The resumes of the four tests below, one job each of one torchrun: {job: (its root, its result)}.
    `newest_verified`: step 3 has 64 flipped bytes, step 2 a missing shard; `between_renames`: killed
    after step_3 -> step_3.replaced, before step_3.partial -> step_3 (the old copy: step 2's save);
    `update` / `lr`: the pristine run resumed at step 1 / 2, the next optimizer step taken again."""
    folder = tmp_path_factory.mktemp("resumed")
    damaged = _copy(saved, folder / "newest_verified")
    _flip64(step_dir(damaged, 3) / "dist" / "__0_0.distcp")
    (step_dir(damaged, 2) / "dist" / "__1_0.distcp").unlink()
    renamed = _copy(saved, folder / "between_renames")
    s3 = step_dir(renamed, 3)
    s3.rename(s3.with_name(s3.name + ".partial"))
    shutil.copytree(step_dir(renamed, 2), s3.with_name(s3.name + ".replaced"))
    assert [s for s, _ in list_checkpoints(renamed)] == [1, 2]
    pristine = saved[0]
    roots = {"newest_verified": damaged, "between_renames": renamed, "update": pristine, "lr": pristine}
    jobs = {
        "newest_verified": ["load", str(damaged)],
        "between_renames": ["load", str(renamed)],
        "update": ["continue", str(pristine)],
        "lr": ["continue", str(pristine), "2"],
    }
    out = _batch(jobs, folder)
    return {job: (roots[job], out[job]) for job in jobs}


def test_resume_loads_exactly_the_newest_verified_checkpoint_and_prune_keeps_it(saved, resumed):
    root, loaded = resumed["newest_verified"]
    assert loaded["path"] == str(step_dir(root, 1)) and loaded["step"] == 1
    assert loaded["digests"] == saved[1][1] != saved[1][3]
    prune(root, keep_last=2)
    assert [s for s, _ in list_checkpoints(root)] == [1, 2, 3]  # the only intact one stays


def test_a_crash_between_the_renames_of_a_resave_resumes_the_new_save(saved, resumed):
    """Killed after step_3 -> step_3.replaced, before step_3.partial -> step_3: both copies are sealed
    (the old one here is step 2's save); resume restores the new one and loads it, nothing is lost."""
    root, loaded = resumed["between_renames"]
    s3 = step_dir(root, 3)
    assert loaded["path"] == str(s3) and loaded["step"] == 3 and loaded["digests"] == saved[1][3]
    prune(root, keep_last=2)
    assert [p.name for p in sorted(root.iterdir())] == ["step_000002", "step_000003"]


def test_an_update_after_resume_equals_the_uninterrupted_update(saved, resumed):
    """Model, Adam moments and Adam's step all come back: the next update is bit-identical.

    (megatron-core's CPU path shared one `step` tensor between all parameters after a load, which
    torch's Adam then advanced once per parameter: save.unshare_adam_steps.)"""
    _, digests = saved
    _, out = resumed["update"]
    assert out["digests"] == digests[2]


def test_the_lr_schedule_continues_exactly_after_resume(saved_run, resumed):
    """Resumed at step 2 (a policy that had already stepped once), step 3 runs at the LR and gives the
    weights of the uninterrupted run's step 3: the scheduler's step count comes back from the checkpoint
    (warm-up then cosine, so every step's LR differs)."""
    _, out = saved_run
    lrs = {int(k): v for k, v in out["lr"].items()}
    assert len(set(lrs.values())) == 3
    _, resumed_at_2 = resumed["lr"]
    assert resumed_at_2["lr"] == lrs[3]
    assert resumed_at_2["digests"] == out["3"]


# The tiny checkpoint is 19.77 MB on disk; the pre-save estimate 19.44 MB. 4 MiB fails the check before
# a byte is written; 19.6 MB passes it, and the writes themselves run out of space. 12 MiB holds each
# rank's half but not the total: only rank 0 compares the total, and every rank must still raise.
DISKS = {
    "before": ("4m", "async"),
    "total": ("12m", "sync"),
    "sync": ("19600000", "sync"),
    "async": ("19600000", "async"),
}


@pytest.fixture(scope="module")
def full_disks(tmp_path_factory):
    """Each case of DISKS saved onto a tmpfs of its size, one job each of one torchrun: {case: (mount, result)}."""
    folder = tmp_path_factory.mktemp("disks")
    mounted = []
    try:
        for case, (size, _) in DISKS.items():
            mnt = folder / f"disk_{case}"
            mnt.mkdir()
            if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]).returncode:
                pytest.skip("cannot mount a tmpfs here (needs root)")
            mounted.append(mnt)
        jobs = {case: ["nospace", str(mnt / "run"), DISKS[case][1]] for case, mnt in zip(DISKS, mounted)}
        out = _batch(jobs, folder)
        yield {case: (mnt, out[case]) for case, mnt in zip(DISKS, mounted)}
    finally:
        for mnt in mounted:
            subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("case", list(DISKS))
def test_a_full_disk_says_no_space_left_naming_the_directory_and_bytes(full_disks, case):
    size, _ = DISKS[case]
    mnt, out = full_disks[case]
    assert out["error"].startswith(f"no space left on device for the checkpoint in {mnt / 'run'}")
    assert "19435520 bytes" in out["error"] and "checkpoint.dir" in out["error"]
    assert out["errors"] == [out["error"]] * 2  # the same verdict on every rank, none left waiting
    if size not in ("4m", "12m"):
        assert out["cause"] is not None  # raised by the write itself, translated
    assert list_checkpoints(mnt / "run") == []  # nothing that looks loadable
