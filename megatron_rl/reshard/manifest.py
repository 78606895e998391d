"""The manifest of a published version, and the checks a staged version must pass to activate.

A manifest entry per engine tensor: name, shape, dtype, checksum, source step. The checksum is a
two-level hash over the tensor's bytes: the digest of each plan piece (the run of rows one trainer
rank sent; zero padding as its byte count), then one digest over the shape, dtype and those
digests in order. Two levels, because no single rank holds a whole engine tensor before it
arrives: each sender digests the bytes it sends, the receiver recomputes every digest from what
it staged, and a flipped byte, a missing run or a misplaced one changes the result. For a given
plan the checksum is a function of the bytes only, so publishing the same weights twice yields
identical manifests.

Digests (all of the tensor's row-major bytes):
- `xxh3` (CPU default): 128-bit XXH3, ~9 GB/s per core here -- 6x sha256, 14x blake2b. Hashing
  runs at publication speed on CPU, where the network is memory copies too, so a slow hash would
  cost more than the transfer. Not cryptographic: the failure model is corruption (a flipped
  bit, a dropped or misplaced run, a stale buffer), not an adversary; a random corruption goes
  unnoticed with probability 2^-128.
- `sha256`: cryptographic, ~1.4 GB/s (hardware-accelerated); for whoever wants it.
- `wsum64` (CUDA default): computed on the device -- position-weighted sums of the 16-bit words
  modulo 2^61-1, two weightings -- because hashing on the host would copy every published byte
  over PCIe and run at one core's speed. It detects any change to one word and any reordering.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from megatron_rl.reshard.convert import as_bytes, region

ALGORITHMS = ("xxh3", "sha256", "wsum64")
_DIGEST_SIZE = {"xxh3": 16, "sha256": 32, "wsum64": 32}
_P61 = (1 << 61) - 1
_P31 = (1 << 31) - 1
_WSUM_CHUNK = 1 << 20  # words per step: bounds the int64 temporaries to ~24 MiB
_WSUM_BLOCK = 1 << 15  # products summed in int64 before reducing
# Two weightings (a*i + b) mod 2^31-1 whose zeros fall on different positions.
_WSUM_WEIGHTS = ((1_000_003, 7), (2_147_483_589, 101))


def default_algorithm(device: torch.device | str) -> str:
    return "wsum64" if torch.device(device).type == "cuda" else "xxh3"


def digest_size(algorithm: str) -> int:
    if algorithm not in _DIGEST_SIZE:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}; use one of {ALGORITHMS}")
    return _DIGEST_SIZE[algorithm]


def _wsum64(words_u16: torch.Tensor, nbytes: int) -> bytes:
    """Position-weighted sums of 16-bit words mod 2^61-1 (two weightings), as 32 bytes."""
    n = words_u16.numel()
    acc = [0, 0]
    for start in range(0, n, _WSUM_CHUNK):
        w = words_u16[start : start + _WSUM_CHUNK].to(torch.int64) & 0xFFFF
        pad = -w.numel() % _WSUM_BLOCK
        if pad:
            w = torch.cat([w, w.new_zeros(pad)])
        pos = torch.arange(start + 1, start + 1 + w.numel(), device=w.device, dtype=torch.int64) % _P31
        for j, (a, b) in enumerate(_WSUM_WEIGHTS):
            # weight < 2^31 and word < 2^16: a product < 2^47, a block of 2^15 products < 2^62.
            weight = (pos * a + b) % _P31
            blocks = (w * weight).view(-1, _WSUM_BLOCK).sum(1) % _P61
            acc[j] = (acc[j] + sum(blocks.tolist())) % _P61
    return struct.pack("<QQQQ", acc[0], acc[1], nbytes, 0x5753554D)


def digest(t: torch.Tensor, algorithm: str = "xxh3") -> bytes:
    """Digest of a tensor's bytes (row-major order; copies only when `t` is not contiguous)."""
    raw = as_bytes(t)
    if algorithm == "xxh3":
        try:
            import xxhash
        except ImportError as e:  # a dependency of wandb, so normally present
            raise ImportError(
                "checksum 'xxh3' needs the xxhash package (pip install xxhash), or use 'sha256'"
            ) from e
        return xxhash.xxh3_128(raw.cpu().numpy()).digest()
    if algorithm == "sha256":
        return hashlib.sha256(raw.cpu().numpy()).digest()
    if algorithm == "wsum64":
        nbytes = raw.numel()
        if nbytes % 2:
            raw = torch.cat([raw, raw.new_zeros(1)])
        return _wsum64(raw.view(torch.int16), nbytes)
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; use one of {ALGORITHMS}")


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
        unit = 1
        for i, s in enumerate(shape):
            unit *= s if i != runs[name][0].dim else 1
        parts = [
            r.digest if r.digest is not None else pad_digest(r.length * unit * itemsize) for r in runs[name]
        ]
        entries[name] = ManifestEntry(
            name, tuple(shape), dtype_name(dtype), tensor_checksum(shape, dtype, parts, algorithm), step
        )
    return Manifest(version, step, algorithm, entries)


def validate(
    staged: Mapping[str, torch.Tensor],
    expected: Manifest,
    runs: Mapping[str, list[Run]],
    max_problems: int = 20,
) -> list[str]:
    """Everything wrong with a staged version, empty when it may activate.

    Checks that every required tensor is there, with its shape and dtype, that no unexpected
    tensor is, and recomputes every run's digest from the staged bytes (padding must be zero).
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
        parts = []
        for r in runs[name]:
            part = region(t, r.dim, r.offset, r.length)
            if r.digest is None:
                if bool(torch.any(as_bytes(part) != 0)):
                    problems.append(f"{name}: padding rows {r.offset}..{r.offset + r.length} are not zero")
                parts.append(pad_digest(part.numel() * part.element_size()))
            else:
                parts.append(digest(part, expected.algorithm))
        got = tensor_checksum(entry.shape, t.dtype, parts, expected.algorithm)
        if got != entry.checksum:
            bad = [r for r, d in zip(runs[name], parts) if r.digest is not None and d != r.digest]
            where = ", ".join(
                f"{('rows', 'columns')[r.dim]} {r.offset}..{r.offset + r.length}" for r in bad[:3]
            )
            problems.append(
                f"{name}: checksum mismatch in {where or 'padding'}; bytes differ from what was sent"
            )
    extra = sorted(set(staged) - set(expected.entries))
    if extra:
        problems.append(f"unexpected tensors staged: {extra[:5]}")
    return problems
