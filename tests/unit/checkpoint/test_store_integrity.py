"""Checkpoint integrity on checkpoint-shaped directories: manifests, verification, fallback, pruning,
re-saves, code-free RNG files, full disks and `megatron-rl ckpt verify` (real checkpoints written by
megatron-core: tests/integration/checkpoint/test_checkpoint_integrity.py)."""

import errno
import json
import os
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from megatron_rl.checkpoint.integrity import (
    MANIFEST,
    NoSpaceError,
    ensure_space,
    is_disk_full,
    verify,
    write_manifest,
    write_sums,
)
from megatron_rl.checkpoint.state import load_rng_state, rng_state, set_rng_state
from megatron_rl.checkpoint.store import (
    MARKER,
    list_checkpoints,
    newest_verified,
    partial_dir,
    prune,
    replace_into_place,
    step_dir,
)
from megatron_rl.cli.ckpt import main as ckpt_main
from tests.helpers.launch import REPO


def _save(root, step, seed=0, sealed=True):
    """A checkpoint as save.py leaves it: files, per-rank sums, manifest, marker, renamed into place."""
    work = partial_dir(root, step)
    (work / "dist").mkdir(parents=True)
    g = torch.Generator().manual_seed(seed * 100 + step)
    for rank in (0, 1):
        for k in (0, 1):
            (work / "dist" / f"__{rank}_{k}.distcp").write_bytes(
                torch.randn(4096, generator=g).numpy().tobytes()
            )
        torch.save(rng_state(), work / f"rank_{rank:05d}.pt")
        write_sums(work, rank, [work / f"rank_{rank:05d}.pt", *sorted((work / "dist").glob(f"__{rank}_*"))])
    (work / "dist" / ".metadata").write_bytes(b"m" * 300)
    (work / "run_state.json").write_text(json.dumps({"step": step}))
    if not sealed:
        return work
    write_manifest(work, step)
    (work / MARKER).write_text("{}")
    replace_into_place(work, step_dir(root, step))
    return step_dir(root, step)


def _flip(path, n=64, at=100):
    raw = bytearray(path.read_bytes())
    for i in range(at, at + n):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


FAULTS = {
    "missing rank shard": (lambda d: (d / "dist" / "__1_0.distcp").unlink(), "dist/__1_0.distcp: missing"),
    "truncated shard": (
        lambda d: os.truncate(d / "dist" / "__0_1.distcp", 1000),
        "dist/__0_1.distcp: 1000 bytes, the manifest says 16384",
    ),
    "empty .metadata": (
        lambda d: (d / "dist" / ".metadata").write_bytes(b""),
        "dist/.metadata: 0 bytes, the manifest says 300",
    ),
    "64 flipped bytes": (
        lambda d: _flip(d / "dist" / "__1_1.distcp"),
        "dist/__1_1.distcp: checksum mismatch",
    ),
    "planted rank file": (
        lambda d: (d / "rank_00000.pt").write_bytes(b"x" * (d / "rank_00000.pt").stat().st_size),
        "rank_00000.pt: checksum mismatch",
    ),
    "extra file": (lambda d: (d / "dist" / "__7_0.distcp").write_bytes(b"?"), "files the save did not write"),
    "no marker": (lambda d: (d / MARKER).unlink(), "no COMPLETE marker"),
    "no manifest": (lambda d: (d / MANIFEST).unlink(), "no MANIFEST.json"),
    "garbled manifest": (lambda d: (d / MANIFEST).write_text("{"), "MANIFEST.json is unreadable"),
    # symbolic links anywhere, to copies outside the checkpoint: the bytes are not its own
    "symlinked shard": (lambda d: _link_out(d, "dist/__0_0.distcp"), "symbolic links inside the checkpoint"),
    "symlinked dist/": (lambda d: _link_out(d, "dist"), "symbolic links inside the checkpoint"),
    "extra symlinked folder": (
        lambda d: (d / "more").symlink_to(d.parent, target_is_directory=True),
        "symbolic links inside the checkpoint (its files must be its own): ['more']",
    ),
    # a manifest of any other shape than the one written: does not verify, never a traceback
    "manifest is a list": (lambda d: _edit(d, lambda m: [m]), "a JSON list, not an object"),
    "entry without bytes": (
        lambda d: _edit(d, lambda m: m["files"]["run_state.json"].pop("bytes") and m),
        "run_state.json: no byte count",
    ),
    "no total_bytes": (lambda d: _edit(d, lambda m: m.pop("total_bytes") and m), "no 'total_bytes'"),
    "entry not an object": (
        lambda d: _edit(d, lambda m: m["files"].update({"run_state.json": 17}) or m),
        "an entry that is not an object",
    ),
    "no files object": (lambda d: _edit(d, lambda m: m.update(files=[]) or m), "no 'files' object"),
    "path out of the checkpoint": (
        lambda d: _edit(d, lambda m: m["files"].update({"../outside": {"bytes": 0, "xxh3_128": "0"}}) or m),
        "does not stay inside the checkpoint",
    ),
    "total that is not the sum": (
        lambda d: _edit(d, lambda m: m.update(total_bytes=m["total_bytes"] + 1) or m),
        "is not the sum",
    ),
}


def _link_out(d, rel):
    """Move `rel` out of the checkpoint and leave a symbolic link to the copy in its place."""
    outside = d.parent / f"outside-{rel.replace('/', '_')}"
    (d / rel).rename(outside)
    (d / rel).symlink_to(outside, target_is_directory=outside.is_dir())


def _edit(d, change):
    (d / MANIFEST).write_text(json.dumps(change(json.loads((d / MANIFEST).read_text()))))


def test_a_sealed_checkpoint_verifies_and_lists_every_file(tmp_path):
    d = _save(tmp_path, 1)
    assert verify(d) == [] and verify(d, full=False) == []
    files = json.loads((d / MANIFEST).read_text())["files"]
    assert set(files) == {
        *(f"dist/__{r}_{k}.distcp" for r in (0, 1) for k in (0, 1)),
        "dist/.metadata",
        "rank_00000.pt",
        "rank_00001.pt",
        "run_state.json",
    }
    assert not list(d.glob("sums_rank_*"))  # merged into the manifest


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_named_and_resume_falls_back_to_the_older_intact_one(tmp_path, fault):
    damage, message = FAULTS[fault]
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    damage(newest)
    problems = verify(newest)
    assert any(message in p for p in problems), problems
    (step, path), skipped = newest_verified(tmp_path)
    assert step == 1 and [s[0] for s in skipped] == [newest] and skipped[0][1] == problems


@pytest.mark.parametrize(
    "fault", ["symlinked dist/", "entry without bytes", "no total_bytes", "manifest is a list"]
)
def test_resume_auto_skips_a_checkpoint_that_does_not_verify_and_ckpt_verify_says_why(
    tmp_path, fault, capsys
):
    """On main these raised KeyError/AttributeError: resume=auto crashed, `ckpt verify` printed a traceback."""
    from megatron_rl.checkpoint.resume import find

    older = _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    FAULTS[fault][0](newest)
    assert find("auto", tmp_path) == older
    assert ckpt_main(["verify", str(newest)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {newest}" in out and FAULTS[fault][1] in out


def test_quick_verify_sees_sizes_only_and_shares_split_the_rehashing(tmp_path):
    d = _save(tmp_path, 1)
    _flip(d / "dist" / "__0_0.distcp")
    assert verify(d, full=False) == []  # same size: only a checksum sees it
    shares = [verify(d, share=(r, 3)) for r in range(3)]
    assert sum(len(s) for s in shares) == 1 and verify(d) == [p for s in shares for p in s]


def test_prune_never_deletes_the_newest_verified_checkpoint(tmp_path):
    _save(tmp_path, 1)
    for step in (2, 3):  # complete but broken: the case
        (_save(tmp_path, step) / "dist" / "__1_0.distcp").unlink()
    removed = prune(tmp_path, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2, 3] and removed == []
    removed = prune(tmp_path, keep_last=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 3] and removed == [step_dir(tmp_path, 2)]


def test_resave_replaces_whole_and_an_interrupted_resave_leaves_the_old_one(tmp_path):
    old = _save(tmp_path, 4, seed=0)
    old_manifest = (old / MANIFEST).read_text()
    work = _save(tmp_path, 4, seed=1, sealed=False)  # a re-save in progress: new shards, no marker yet
    assert verify(old) == [] and (old / MANIFEST).read_text() == old_manifest
    assert [p for _, p in list_checkpoints(tmp_path)] == [old]  # the partial is never a candidate
    prune(tmp_path, keep_last=2)  # ... and is removed once stale
    assert not work.exists() and verify(old) == []
    new = _save(tmp_path, 4, seed=2)
    assert new == old and verify(new) == [] and (new / MANIFEST).read_text() != old_manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000004"]


class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_rng_files_load_without_running_code(tmp_path):
    marker = tmp_path / "pwned"
    planted = tmp_path / "rank_00000.pt"
    planted.write_bytes(pickle.dumps({"torch": _Planted(marker)}))
    with pytest.raises(pickle.UnpicklingError):
        load_rng_state(planted)
    assert not marker.exists()
    torch.save(rng_state(), tmp_path / "ok.pt")
    drawn = (torch.rand(4), torch.tensor(np.random.rand(4)), random.random())
    set_rng_state(load_rng_state(tmp_path / "ok.pt"))  # back to before those draws
    again = (torch.rand(4), torch.tensor(np.random.rand(4)), random.random())
    assert torch.equal(drawn[0], again[0]) and torch.equal(drawn[1], again[1]) and drawn[2] == again[2]


def test_disk_full_is_recognised_however_it_is_worded():
    from torch.distributed.checkpoint.api import CheckpointException

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"))
    wrapped = CheckpointException("write", {1: (RuntimeError("Worker failure: unexpected pos 7 vs 5"), None)})
    assert is_disk_full(wrapped)
    try:
        try:
            raise OSError(errno.ENOSPC, "full")
        except OSError as inner:
            raise ValueError("write failed") from inner
    except ValueError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(CheckpointException("write", {0: (KeyError("step"), None)}))


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_no_space_names_the_directory_and_the_bytes_needed(small_disk):
    target = small_disk / "run" / "ckpts"  # not created yet: the check looks at the disk it will be on
    ensure_space(target, 100_000)
    with pytest.raises(NoSpaceError) as e:
        ensure_space(target, 5_000_000)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and str(target) in msg and "5000000 bytes" in msg
    assert "no space left on device" in msg and "1.0 MiB are free" in msg and "checkpoint.dir" in msg
    with pytest.raises(OSError) as real:  # what a write really raises on that disk
        (small_disk / "fill").write_bytes(b"0" * 2_000_000)
    assert is_disk_full(real.value)


def test_ckpt_verify_exit_codes(tmp_path, capsys):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    assert ckpt_main(["verify", str(tmp_path)]) == 0
    assert "resume=auto would take: " + str(step_dir(tmp_path, 2)) in capsys.readouterr().out
    _flip(step_dir(tmp_path, 2) / "dist" / "__0_0.distcp")
    assert ckpt_main(["verify", str(tmp_path), "--quick"]) == 0  # sizes only
    assert ckpt_main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "__0_0.distcp: checksum mismatch" in out and str(step_dir(tmp_path, 1)) in out
    assert ckpt_main(["verify", str(step_dir(tmp_path, 1))]) == 0
    assert ckpt_main(["verify", str(tmp_path / "nope")]) == 2
    assert ckpt_main(["verify", str(tmp_path / "step_000001" / "dist")]) == 2  # not a checkpoint
    assert ckpt_main([]) == 2
    cli = subprocess.run(
        [sys.executable, "-m", "megatron_rl.cli", "ckpt", "verify", str(step_dir(tmp_path, 2))],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert cli.returncode == 1 and "checksum mismatch" in cli.stdout and "Traceback" not in cli.stderr


# ---- a reused run name with checkpoint.resume=none ------------------------------------------------


@pytest.fixture
def earlier_run(tmp_path, monkeypatch):
    """checkpoint.dir/<run name> holding an earlier run's step_* directories."""
    monkeypatch.setenv("MEGATRON_RL_RUN_NAME", "reused")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    root = tmp_path / "ckpt" / "reused"
    (root / "step_000005").mkdir(parents=True)
    (root / "step_000006.partial").mkdir()
    args = [
        "grpo_tiny_cpu",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
        "checkpoint.resume=none",
        f"logger.run_dir={tmp_path / 'out'}",
    ]
    return root, args


def test_a_fresh_start_over_an_earlier_runs_checkpoints_is_refused(earlier_run, tmp_path):
    from megatron_rl.checkpoint.store import fresh_start_conflict

    root, _ = earlier_run
    msg = fresh_start_conflict("none", root)
    assert str(root) in msg and "another run name" in msg and "move or delete" in msg and "\n" not in msg
    assert fresh_start_conflict("auto", root) is None
    assert fresh_start_conflict("none", tmp_path / "nothing") is None
    (tmp_path / "empty").mkdir()
    assert fresh_start_conflict("none", tmp_path / "empty") is None


def test_train_refuses_it_at_start_up_before_anything_is_built(earlier_run, tmp_path, monkeypatch):
    import megatron_rl.loop.placement.processes as processes_mod
    from megatron_rl import train

    root, args = earlier_run

    def built(*a, **k):
        raise AssertionError("init_parallel ran before the refusal")

    monkeypatch.setattr(processes_mod, "init_parallel", built)
    with pytest.raises(SystemExit, match="already holds checkpoints") as e:
        train.main(args)
    assert str(root) in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing written for the new run
    assert sorted(p.name for p in root.iterdir()) == ["step_000005", "step_000006.partial"]


def test_validate_says_it_too(earlier_run, capsys):
    from megatron_rl.cli.recipes import validate

    root, args = earlier_run
    assert validate(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint.resume=none") and str(root) in err
    assert validate([a for a in args if a != "checkpoint.resume=none"]) == 0  # auto resumes it: fine


# ---- a crash between the two renames of a re-save --------------------------------------------------


def _crash_between_renames(root, damage_new=False):
    """Step 2 saved, then re-saved and killed after step_2 -> .replaced, before .partial -> step_2."""
    _save(root, 1)
    old = _save(root, 2, seed=1)
    new = _save(root, 2, seed=2, sealed=False)
    write_manifest(new, 2)
    (new / MARKER).write_text("{}")
    if damage_new:
        _flip(new / "dist" / "__0_0.distcp")
    old.rename(old.with_name(old.name + ".replaced"))
    return new, old


def _digest(d):
    return (d / "dist" / "__0_0.distcp").read_bytes()


@pytest.mark.parametrize("by", ["prune", "find"])
def test_a_crash_between_renames_brings_the_new_save_back_not_deletes_both(tmp_path, by):
    from megatron_rl.checkpoint.resume import find

    root = tmp_path / "run"
    new, _ = _crash_between_renames(root)
    want = _digest(new)
    assert [s for s, _ in list_checkpoints(root)] == [1]
    if by == "prune":
        prune(root, keep_last=2)
    else:
        assert find("auto", root) == step_dir(root, 2)
    assert verify(step_dir(root, 2)) == [] and _digest(step_dir(root, 2)) == want
    prune(root, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]


def test_a_damaged_new_save_gives_back_the_replaced_one(tmp_path):
    root = tmp_path / "run"
    _, old = _crash_between_renames(root, damage_new=True)
    want = _digest(old.with_name(old.name + ".replaced"))
    prune(root, keep_last=1)
    assert sorted(p.name for p in root.iterdir()) == ["step_000002"]
    assert verify(step_dir(root, 2)) == [] and _digest(step_dir(root, 2)) == want


def test_an_unsealed_partial_is_still_just_removed(tmp_path):
    root = tmp_path / "run"
    _save(root, 1)
    _save(root, 2, sealed=False)
    prune(root, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_000001"]
