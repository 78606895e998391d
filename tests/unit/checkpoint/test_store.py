"""Finding and pruning checkpoints: incomplete ones are skipped and never chosen."""

from megatron_rl.checkpoint.store import MARKER, list_checkpoints, newest_complete, prune, step_dir


def _make(root, step, complete=True):
    d = step_dir(root, step)
    (d / "dist").mkdir(parents=True)
    if complete:
        (d / MARKER).write_text("{}")
    return d


def test_newest_complete_skips_marker_less(tmp_path, caplog):
    _make(tmp_path, 3)
    _make(tmp_path, 5)
    _make(tmp_path, 7, complete=False)  # a save killed half-way
    step, path = newest_complete(tmp_path)
    assert step == 5 and path.name == "step_000005"
    assert "no COMPLETE marker" in caplog.text


def test_nothing_complete(tmp_path):
    _make(tmp_path, 1, complete=False)
    assert newest_complete(tmp_path) is None
    assert newest_complete(tmp_path / "missing") is None


def test_prune_keeps_last_and_every(tmp_path):
    for s in range(1, 9):
        _make(tmp_path, s)
    removed = prune(tmp_path, keep_last=2, keep_every=4)
    left = [s for s, _ in list_checkpoints(tmp_path)]
    assert left == [4, 7, 8] and len(removed) == 5


def test_prune_removes_stale_partials_only(tmp_path):
    _make(tmp_path, 2)
    _make(tmp_path, 1, complete=False)
    _make(tmp_path, 3, complete=False)  # newer than the newest complete: maybe still being written
    prune(tmp_path, keep_last=5)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
