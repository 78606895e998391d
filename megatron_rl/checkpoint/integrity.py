"""Per-file checksums of a checkpoint, the manifest that holds them, and verification.

The `COMPLETE` marker says a save finished; it cannot say the files are still what was written (a
shard truncated by a full disk, a rank's shard lost in a copy, flipped bytes on a bad drive). So
every file of a checkpoint is listed in `MANIFEST.json` with its size and XXH3-128 digest, and the
manifest is written before the marker. Each rank hashes the files it wrote itself, in the background
part of an async save (the files are still in the page cache then) and writes `sums_rank_R.json`;
rank 0 merges those, hashes the small files written at finalisation, and writes the manifest.

Verification is the reverse, and can be shared: rank r of a job re-hashes every world-th file, and
the problems of all ranks are gathered (resume.py). A quick check (sizes only, no reading) catches
missing, truncated and empty files; the full check also catches changed bytes. Either way a
checkpoint verifies only when it is exactly what was written: no symbolic link anywhere in it (a shard
or `dist/` pointing at a copy elsewhere is not the checkpoint's own bytes), no file the manifest does
not list, and a manifest of the one shape `write_manifest` writes. A manifest of any other shape (a
list, an entry without "bytes", no "total_bytes", a path leading out of the checkpoint) means "does
not verify", with the reason, never an exception: `resume=auto` then falls back to an older one.

Verification also stands between a checkpoint directory and code execution: torch DCP's
`FileSystemReader.read_metadata` (under megatron-core's `dist_checkpointing.load`) pickle-loads
`dist/.metadata`, so a planted `.metadata` would run code. Every DCP read in this project comes
after a full verification of the directory against its manifest: resume (`resume.find` -> `load`,
auto or an explicit path), `tools/export_hf.py`; `megatron-rl ckpt verify` reads no DCP file at
all; the RNG files load with `weights_only=True`. Residual risk: the manifest is not signed, so
whoever can write the directory can rewrite `MANIFEST.json` along with `.metadata` -- the checksums
detect corruption, not an adversary; a checkpoint directory must be as trusted as the code that
reads it. Also, a file replaced between verification and the read is not caught.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "MANIFEST.json"
ALGORITHM = "xxh3_128"
_UNLISTED = {"COMPLETE", MANIFEST}  # the files written after (or as) the manifest
_READ = 8 << 20


def file_digest(path: Path) -> str:
    """XXH3-128 of a file's bytes, read in 8 MiB blocks."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(_READ):
            h.update(block)
    return h.hexdigest()


def describe(root: Path, files: Iterable[Path]) -> dict[str, dict]:
    """{relative path: {"bytes", ALGORITHM}} for files under root."""
    out = {}
    for f in sorted(files):
        out[f.relative_to(root).as_posix()] = {"bytes": f.stat().st_size, ALGORITHM: file_digest(f)}
    return out


def sums_file(ckpt: Path, rank: int) -> Path:
    return ckpt / f"sums_rank_{rank:05d}.json"


def write_sums(ckpt: Path, rank: int, files: Iterable[Path]) -> None:
    """This rank's files and their digests (merged into the manifest by rank 0 at finalisation)."""
    write_text(sums_file(ckpt, rank), json.dumps(describe(ckpt, files)))


def write_manifest(ckpt: Path, step: int) -> dict:
    """Merge every rank's sums, hash the files no rank claimed, write MANIFEST.json (rank 0)."""
    files: dict[str, dict] = {}
    sums = sorted(ckpt.glob("sums_rank_*.json"))
    for s in sums:
        files.update(json.loads(s.read_text()))
    rest = [p for p in ckpt.rglob("*") if p.is_file() and p not in sums and p.name not in _UNLISTED]
    files.update(describe(ckpt, [p for p in rest if p.relative_to(ckpt).as_posix() not in files]))
    manifest = {
        "format": 1,
        "step": step,
        "algorithm": ALGORITHM,
        "total_bytes": sum(f["bytes"] for f in files.values()),
        "files": files,
    }
    write_text(ckpt / MANIFEST, json.dumps(manifest, indent=1))
    for s in sums:
        s.unlink()
    return manifest


def read_manifest(ckpt: Path) -> tuple[dict | None, str]:
    """The manifest, checked for the shape `write_manifest` writes; (None, why) when it is not that."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return None, f"no {MANIFEST} (saved before checkpoints carried checksums, or the save was cut short)"
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
        return None, f"{MANIFEST} is unreadable ({e.__class__.__name__}: {e})"
    why = _malformed(manifest)
    return (None, f"{MANIFEST} is malformed: {why}") if why else (manifest, "")


def _malformed(manifest: object) -> str | None:
    """What is wrong with a decoded manifest's shape, or None."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    if manifest.get("algorithm") != ALGORITHM:
        return f"algorithm {manifest.get('algorithm')!r}, expected {ALGORITHM!r}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "no 'files' object"
    for rel, entry in files.items():
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts or rel != Path(rel).as_posix():
            return f"the listed path {rel!r} does not stay inside the checkpoint"
        if not isinstance(entry, dict):
            return f"{rel}: an entry that is not an object"
        size, digest = entry.get("bytes"), entry.get(ALGORITHM)
        if type(size) is not int or size < 0:
            return f"{rel}: no byte count ('bytes')"
        if not isinstance(digest, str) or not digest:
            return f"{rel}: no {ALGORITHM} digest"
    total = manifest.get("total_bytes")
    if type(total) is not int:
        return "no 'total_bytes'"
    if total != sum(e["bytes"] for e in files.values()):
        return f"total_bytes {total} is not the sum of the files' bytes"
    return None


def _entries(ckpt: Path) -> tuple[list[str], list[str]]:
    """(every file below `ckpt`, every symbolic link below it), relative, without following links."""
    files, links = [], []
    for top, dirs, names in os.walk(ckpt, followlinks=False):
        for name in [*dirs, *names]:
            full = Path(top) / name
            rel = full.relative_to(ckpt).as_posix()
            if full.is_symlink():
                links.append(rel)
            elif name in names:
                files.append(rel)
    return files, links


def verify(ckpt: Path, full: bool = True, share: tuple[int, int] = (0, 1)) -> list[str]:
    """Everything wrong with a checkpoint directory (empty = it verifies).

    `share=(r, n)`: re-hash only every n-th listed file starting at r (the checks that read nothing
    run everywhere); `full=False`: sizes only.
    """
    if ckpt.is_symlink():
        return [f"{ckpt} is a symbolic link, not the checkpoint's own directory"]
    if not ckpt.is_dir():
        return [f"{ckpt} is not a directory"]
    on_disk, links = _entries(ckpt)
    if links:
        return [f"symbolic links inside the checkpoint (its files must be its own): {sorted(links)[:5]}"]
    if not (ckpt / "COMPLETE").is_file():
        return ["no COMPLETE marker (the save was interrupted)"]
    manifest, why = read_manifest(ckpt)
    if manifest is None:
        return [why]
    problems = []
    listed = manifest["files"]
    for i, (rel, want) in enumerate(sorted(listed.items())):
        f = ckpt / rel
        if not f.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = f.stat().st_size
        if size != want["bytes"]:
            problems.append(
                f"{rel}: {size} bytes, the manifest says {want['bytes']} (truncated or overwritten)"
            )
        elif full and i % share[1] == share[0] and file_digest(f) != want[ALGORITHM]:
            problems.append(f"{rel}: checksum mismatch (the bytes changed after the save)")
    extra = sorted(set(on_disk) - set(listed) - _UNLISTED)
    if extra:
        problems.append(f"files the save did not write: {extra[:5]}")
    return problems


class NoSpaceError(OSError):
    """A checkpoint does not fit on its disk; says where, how much is needed and how much is free."""

    def __init__(self, directory: Path, needed: int, free: int | None = None):
        free = shutil.disk_usage(_existing(directory)).free if free is None else free
        super().__init__(
            errno.ENOSPC,
            f"no space left on device for the checkpoint in {directory}: it needs about {_size(needed)} "
            f"({needed} bytes), {_size(free)} are free; free space there, lower checkpoint.keep_last, "
            "or point checkpoint.dir at a larger disk",
        )
        self.directory, self.needed, self.free = directory, needed, free

    def __str__(self) -> str:
        return self.strerror


def ensure_space(directory: Path, needed: int) -> None:
    """Refuse a save that cannot fit before writing a byte of it."""
    free = shutil.disk_usage(_existing(directory)).free
    if needed > free:
        raise NoSpaceError(directory, needed, free)


def is_disk_full(exc: BaseException) -> bool:
    """Whether an exception (or one it wraps) is a full disk, however the writer phrased it.

    PyTorch's zip writer reports ENOSPC as "enforce fail ... unexpected pos"; megatron-core wraps the
    async writer's error in a CheckpointException.
    """
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        text = str(e)
        if "No space left on device" in text or "unexpected pos" in text:
            return True
        stack += [e.__cause__, e.__context__]
        for failure in getattr(e, "failures", {}).values():  # torch.distributed.checkpoint: rank -> error
            stack.append(failure[0] if isinstance(failure, tuple) else failure)
    return False


def write_text(path: Path, text: str) -> None:
    """Write a small file and fsync it (a marker must not reach the disk before what it vouches for)."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
