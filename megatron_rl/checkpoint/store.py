"""Finding, ordering and pruning checkpoints on disk; the completion marker."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)
MARKER = "COMPLETE"
_STEP = re.compile(r"^step_(\d{6,})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """All step directories under root, oldest first (complete or not)."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def newest_complete(root: Path) -> tuple[int, Path] | None:
    """The newest checkpoint that has its completion marker; incomplete ones are skipped with a warning."""
    for step, path in reversed(list_checkpoints(root)):
        if is_complete(path):
            return step, path
        log.warning(
            "skipping checkpoint %s: no %s marker (the save was interrupted); it will not be loaded",
            path,
            MARKER,
        )
    return None


def prune(root: Path, keep_last: int, keep_every: int = 0) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep_last` (keeping every `keep_every`-th step),
    and incomplete ones older than the newest complete one. Returns what was removed."""
    ckpts = list_checkpoints(root)
    complete = [(s, p) for s, p in ckpts if is_complete(p)]
    keep = {p for _, p in complete[-keep_last:]} if keep_last > 0 else {p for _, p in complete}
    if keep_every > 0:
        keep |= {p for s, p in complete if s % keep_every == 0}
    newest = complete[-1][0] if complete else -1
    removed = []
    for s, p in ckpts:
        stale_partial = not is_complete(p) and s < newest
        if (is_complete(p) and p not in keep) or stale_partial:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
