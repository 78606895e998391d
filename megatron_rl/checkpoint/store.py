"""Finding, ordering and pruning checkpoints on disk; the completion marker; the save's temp directory.

A save writes into `step_000012.partial/` and is renamed to `step_000012/` only once its manifest and
marker are written, so a directory named like a checkpoint was complete when it got that name, and a
re-save of an existing step never mixes new shards with an old marker. Names that are not
`step_<digits>` (partials, a replaced directory on its way out) are never candidates for loading.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from megatron_rl.checkpoint.integrity import verify

log = logging.getLogger(__name__)
MARKER = "COMPLETE"
_STEP = re.compile(r"^step_(\d{6,})$")
_LEFTOVER = re.compile(r"^step_(\d{6,})\.(partial|replaced)$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def partial_dir(root: Path, step: int) -> Path:
    """Where a save of `step` is written before it is renamed into place."""
    return root / f"step_{step:06d}.partial"


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


def fresh_start_conflict(resume: str, root: Path) -> str | None:
    """Why `checkpoint.resume=none` must not start in `root`, or None: it holds an earlier run's step_*.

    Reusing a run name afresh would mix two runs: prune keeps the newest steps by number (the old
    run's, deleting the new run's), and a later resume=auto resumes the old run. Checked at start-up,
    before anything is built, and by `megatron-rl validate`."""
    if resume != "none" or not root.is_dir():
        return None
    old = sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))
    if not old:
        return None
    return (
        f"checkpoint.resume=none but {root} already holds checkpoints of an earlier run ({len(old)}: "
        f"{old[0]} .. {old[-1]}) that would mix with this one; use another run name "
        "(MEGATRON_RL_RUN_NAME or checkpoint.dir), or move or delete that directory (or resume=auto)"
    )


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


def newest_verified(
    root: Path, full: bool = True
) -> tuple[tuple[int, Path] | None, list[tuple[Path, list[str]]]]:
    """The newest checkpoint whose files match its manifest, and the newer ones skipped with why."""
    skipped = []
    for step, path in reversed(list_checkpoints(root)):
        problems = verify(path, full=full)
        if not problems:
            return (step, path), skipped
        skipped.append((path, problems))
    return None, skipped


def recover(root: Path) -> list[Path]:
    """Bring back into place a sealed checkpoint that a crash left under a leftover name.

    A kill between the two renames of `replace_into_place` leaves `step_N.replaced` (the old save) and
    `step_N.partial` (the new one, sealed) and no `step_N`; a kill between a save's marker and its
    rename leaves a sealed `step_N.partial`. Where `step_N` is missing, the `.partial` that verifies
    (the newer save), else the `.replaced` that verifies, is renamed to `step_N`; what is left over is
    pruned as before. Run by `prune` and by resume's `find` (rank 0) before they look. Returns the
    restored directories."""
    if not root.is_dir():
        return []
    leftovers: dict[int, dict[str, Path]] = {}
    for p in root.iterdir():
        m = _LEFTOVER.match(p.name)
        if m and p.is_dir():
            leftovers.setdefault(int(m.group(1)), {})[m.group(2)] = p
    restored = []
    for step, kinds in sorted(leftovers.items()):
        final = step_dir(root, step)
        if final.exists():
            continue
        for kind in ("partial", "replaced"):
            p = kinds.get(kind)
            if p is None or not is_complete(p):
                continue
            problems = verify(p)
            if problems:
                log.warning("not restoring %s: %s", p, "; ".join(problems[:3]))
                continue
            p.rename(final)
            log.warning("restored %s from %s (a save was interrupted while renaming it into place)", final, p)
            restored.append(final)
            break
    return restored


def replace_into_place(partial: Path, final: Path) -> None:
    """Rename a finished save to its step name; an existing directory of that name goes only after."""
    if final.exists():
        old = final.with_name(final.name + ".replaced")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        partial.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        partial.rename(final)


def prune(root: Path, keep_last: int, keep_every: int = 0, verified: Path | None = None) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep_last` (keeping every `keep_every`-th step),
    incomplete ones older than the newest complete one, and leftover partial directories. The newest
    checkpoint that verifies is never deleted: `verified` names it when the caller knows it (the save
    that just finished), else it is found by verifying from the newest down. A sealed checkpoint left
    under a leftover name by a crash is restored first (`recover`), not deleted. Returns what was removed."""
    recover(root)
    ckpts = list_checkpoints(root)
    if verified is None:
        found, _ = newest_verified(root)
        verified = found[1] if found else None
    complete = [(s, p) for s, p in ckpts if is_complete(p)]
    keep = {p for _, p in complete[-keep_last:]} if keep_last > 0 else {p for _, p in complete}
    if keep_every > 0:
        keep |= {p for s, p in complete if s % keep_every == 0}
    if verified is not None:
        keep.add(verified)
    newest = complete[-1][0] if complete else -1
    removed = []
    for s, p in ckpts:
        stale_partial = not is_complete(p) and s < newest
        if (is_complete(p) and p not in keep) or stale_partial:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    for p in root.iterdir() if root.is_dir() else []:
        if _LEFTOVER.match(p.name) and p.is_dir():  # a save killed before its rename, a cut-short replace
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
