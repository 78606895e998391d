"""The manifest of a published version, and the checks a staged version must pass to activate.

A manifest entry per engine tensor: name, shape, dtype, checksum, source step. The checksum is a
two-level hash over the tensor's bytes: the digest of each plan piece (the run of rows one trainer
rank sent; zero padding as its byte count), then one digest over the shape, dtype and those
digests in order. Two levels, because no single rank holds a whole engine tensor before it
arrives: each sender digests the bytes it sends, the receiver recomputes every digest from what
it staged, and a flipped byte, a missing run or a misplaced one changes the result. For a given
plan the checksum is a function of the bytes only, so publishing the same weights twice yields
identical manifests.

Digests: checksum.py (xxh3 on CPU, mix128 computed with torch ops on CUDA, sha256 on request).

Validation refuses, besides bytes that differ from what was sent: NaN/Inf (seen while the bytes are
re-hashed, no extra pass), and any row of an engine tensor that no run covers, or that two runs
cover (a plan or a sink that leaves bytes unchecked would otherwise activate them unseen).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from megatron_rl.reshard.checksum import ALGORITHMS, default_algorithm, digest, digest_finite, digest_size
from megatron_rl.reshard.convert import as_bytes, region

__all__ = ["ALGORITHMS", "default_algorithm", "digest", "digest_size", "expected_manifest", "validate"]


def pad_digest(nbytes: int) -> bytes:
    """Stand-in digest of a zero-padding run (its bytes are checked to be zero instead)."""
    return hashlib.sha256(b"zero-padding:%d" % nbytes).digest()


def tensor_checksum(shape: tuple[int, ...], dtype: torch.dtype, parts: list[bytes], algorithm: str) -> str:
    h = hashlib.sha256(f"{algorithm}|{tuple(shape)}|{dtype_name(dtype)}|".encode())
    for d in parts:
        h.update(d)
    return h.hexdigest()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    checksum: str
    step: int


@dataclass
class Manifest:
    """What one engine rank must hold for a version; identical for identical weights and plan."""

    version: int
    step: int
    algorithm: str
    entries: dict[str, ManifestEntry] = field(default_factory=dict)

    def same_weights(self, other: Manifest) -> bool:
        """Equal shapes, dtypes and checksums for every tensor (version and step aside)."""
        strip = lambda m: {k: (e.shape, e.dtype, e.checksum) for k, e in m.entries.items()}  # noqa: E731
        return self.algorithm == other.algorithm and strip(self) == strip(other)

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "step": self.step,
            "algorithm": self.algorithm,
            "entries": {k: {**asdict(e), "shape": list(e.shape)} for k, e in self.entries.items()},
        }


@dataclass(frozen=True)
class Run:
    """A run of rows of a staged tensor and the digest its sender computed (None = zero padding)."""

    dim: int
    offset: int
    length: int
    digest: bytes | None


def expected_manifest(
    version: int,
    step: int,
    algorithm: str,
    shapes: Mapping[str, tuple[int, ...]],
    dtype: torch.dtype,
    runs: Mapping[str, list[Run]],
    itemsize: int,
) -> Manifest:
    """The manifest the senders' digests imply for one engine rank."""
    entries = {}
    for name, shape in shapes.items():
        unit, dim = 1, runs[name][0].dim if runs.get(name) else 0
        for i, s in enumerate(shape):
            unit *= s if i != dim else 1
        parts = [
            r.digest if r.digest is not None else pad_digest(r.length * unit * itemsize)
            for r in runs.get(name, [])
        ]
        entries[name] = ManifestEntry(
            name, tuple(shape), dtype_name(dtype), tensor_checksum(shape, dtype, parts, algorithm), step
        )
    return Manifest(version, step, algorithm, entries)


def coverage_problems(name: str, shape: tuple[int, ...], runs: list[Run]) -> list[str]:
    """Rows of a tensor that no run covers, or that two runs cover (runs sorted by offset)."""
    if not runs:
        return [f"{name}: no transfer run covers any of its bytes"]
    dims = {r.dim for r in runs}
    if len(dims) != 1:
        return [f"{name}: runs along several dimensions {sorted(dims)}; coverage cannot be checked"]
    dim = dims.pop()
    what = ("rows", "columns")[dim] if dim < 2 else f"dim-{dim} indices"
    out, at = [], 0
    for r in sorted(runs, key=lambda r: r.offset):
        if r.offset > at:
            out.append(f"{name}: {what} {at}..{r.offset} are covered by no transfer run")
        elif r.offset < at:
            out.append(f"{name}: {what} {r.offset}..{min(at, r.offset + r.length)} are covered by two runs")
        at = max(at, r.offset + r.length)
    if at != shape[dim]:
        out.append(f"{name}: {what} {at}..{shape[dim]} are covered by no transfer run")
    return out


def validate(
    staged: Mapping[str, torch.Tensor],
    expected: Manifest,
    runs: Mapping[str, list[Run]],
    max_problems: int = 20,
) -> list[str]:
    """Everything wrong with a staged version, empty when it may activate.

    Checks that every required tensor is there, with its shape and dtype, that no unexpected
    tensor is, that the runs cover every byte exactly once, and recomputes every run's digest from
    the staged bytes (padding must be zero), refusing NaN/Inf as it goes.
    """
    problems: list[str] = []
    for name, entry in expected.entries.items():
        if len(problems) >= max_problems:
            problems.append("... (more problems not listed)")
            break
        t = staged.get(name)
        if t is None:
            problems.append(f"{name}: missing from the staged version")
            continue
        if tuple(t.shape) != entry.shape:
            problems.append(f"{name}: shape {list(t.shape)}, manifest says {list(entry.shape)}")
            continue
        if dtype_name(t.dtype) != entry.dtype:
            problems.append(f"{name}: dtype {dtype_name(t.dtype)}, manifest says {entry.dtype}")
            continue
        uncovered = coverage_problems(name, entry.shape, runs.get(name, []))
        if uncovered:
            problems += uncovered
            continue
        parts, nonfinite = [], []
        for r in runs[name]:
            part = region(t, r.dim, r.offset, r.length)
            if r.digest is None:
                if bool(torch.any(as_bytes(part) != 0)):
                    problems.append(f"{name}: padding rows {r.offset}..{r.offset + r.length} are not zero")
                parts.append(pad_digest(part.numel() * part.element_size()))
            else:
                d, finite = digest_finite(part, expected.algorithm)
                parts.append(d)
                if not finite:
                    nonfinite.append(r)
        if nonfinite:
            where = ", ".join(_where(r) for r in nonfinite[:3])
            problems.append(f"{name}: non-finite values (NaN or Inf) in {where}")
        got = tensor_checksum(entry.shape, t.dtype, parts, expected.algorithm)
        if got != entry.checksum:
            bad = [r for r, d in zip(runs[name], parts) if r.digest is not None and d != r.digest]
            where = ", ".join(_where(r) for r in bad[:3])
            problems.append(
                f"{name}: checksum mismatch in {where or 'padding'}; bytes differ from what was sent"
            )
    extra = sorted(set(staged) - set(expected.entries))
    if extra:
        problems.append(f"unexpected tensors staged: {extra[:5]}")
    return problems


def _where(r: Run) -> str:
    return f"{('rows', 'columns')[r.dim]} {r.offset}..{r.offset + r.length}"
