"""Digests of tensor bytes, and the non-finite check that rides along with them.

Algorithms (all read the tensor's row-major bytes):
- `xxh3` (CPU default): 128-bit XXH3, ~9 GB/s per core here -- 6x sha256, 14x blake2b. Hashing
  runs at publication speed on CPU, where the network is memory copies too, so a slow hash would
  cost more than the transfer. Not cryptographic: the failure model is corruption (a flipped bit,
  a dropped or misplaced run, a stale buffer), not an adversary.
- `sha256`: cryptographic, ~1.4 GB/s (hardware-accelerated); for whoever wants it.
- `mix128` (CUDA default): computed on the device with integer torch ops, because hashing on the
  host would copy every published byte over PCIe and run at one core's speed. Every 16-bit word is
  keyed with its position (`pos << 16 | word`, injective), passed through the splitmix64 finaliser
  (a bijection of 64-bit integers whose output bits each depend on every input bit) and the
  results are summed mod 2^64, in two lanes with different keys. A change to any set of words
  changes the sum unless the changed terms happen to cancel, which for these mixed values has
  probability ~2^-64 per lane. The weighted linear sums this replaces had a blind spot that real
  faults hit: with weights linear in the position, +1/-2/+1 on three consecutive words cancels
  exactly (tests/unit/reshard/test_checksum_integrity.py measures both on a fault model). Integer
  arithmetic is exact and order-free, so CPU and CUDA give the same digest.

`digest_finite` also says whether the tensor holds only finite values. It checks each chunk while
the chunk is hashed (the chunk is still in cache): publication refuses NaN/Inf without another pass
over the weights. Measured here (one core, 64 MiB, a busy machine): fp32 xxh3 5-9 GB/s, with the
fused check 6-7.6 GB/s; bf16/fp16 ~3.7 GB/s with the check (the 16-bit sum is the slower part). A
separate `isfinite(...).all()` pass alone runs at ~0.35 GB/s on fp32.
"""

from __future__ import annotations

import hashlib
import struct

import torch

from megatron_rl.reshard.convert import as_bytes

ALGORITHMS = ("xxh3", "sha256", "mix128")
_DIGEST_SIZE = {"xxh3": 16, "sha256": 32, "mix128": 24}
_CHUNK_BYTES = 1 << 20  # per step on the host: bounds the int64 temporaries of mix128 to ~8 MiB each
# On CUDA, larger steps (fewer kernel launches; ~128 MiB per int64 temporary): nothing is read back
# per chunk -- the lane sums and the finite flags stay on the device, one sync per tensor.
_CHUNK_BYTES_CUDA = 16 << 20
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64 multipliers, as signed int64
_M2 = 0x94D049BB133111EB - (1 << 64)
_LANE_KEYS = (0x2545F4914F6CDD1D, 0x1B873593CC9E2D51)
_U64 = (1 << 64) - 1


def default_algorithm(device: torch.device | str) -> str:
    return "mix128" if torch.device(device).type == "cuda" else "xxh3"


def digest_size(algorithm: str) -> int:
    if algorithm not in _DIGEST_SIZE:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}; use one of {ALGORITHMS}")
    return _DIGEST_SIZE[algorithm]


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic on signed integers)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr(x, 30)
    x = x * _M1  # int64 products wrap mod 2^64 on CPU and CUDA
    x = x ^ _shr(x, 27)
    x = x * _M2
    return x ^ _shr(x, 31)


class _Mix128:
    """Streaming mix128: feed byte chunks in order (every chunk but the last of even length).

    The two lane sums accumulate in an int64 tensor on the chunks' device (wrapping mod 2^64, as
    the per-chunk sums do): `digest()` is the only read back to the host."""

    def __init__(self) -> None:
        self.lanes: torch.Tensor | None = None
        self.keys: torch.Tensor | None = None
        self.words = 0
        self.nbytes = 0

    def update(self, raw_u8: torch.Tensor) -> None:
        n = raw_u8.numel()
        if n % 2:
            raw_u8 = torch.cat([raw_u8, raw_u8.new_zeros(1)])
        w = raw_u8.view(torch.int16).to(torch.int64) & 0xFFFF
        if self.lanes is None:
            self.lanes = torch.zeros(2, dtype=torch.int64, device=w.device)
            self.keys = torch.tensor(_LANE_KEYS, dtype=torch.int64, device=w.device)
        pos = torch.arange(self.words, self.words + w.numel(), device=w.device, dtype=torch.int64)
        keyed = (pos << 16) | w
        for j in range(len(_LANE_KEYS)):
            self.lanes[j] += _splitmix(keyed ^ self.keys[j]).sum()
        self.words += w.numel()
        self.nbytes += n

    def digest(self, flag: torch.Tensor | None = None) -> tuple[bytes, bool]:
        """(digest, `flag` read back with the lanes in the same sync; True without one)."""
        if self.lanes is None:
            return struct.pack("<QQQ", 0, 0, self.nbytes), True if flag is None else bool(flag)
        both = self.lanes if flag is None else torch.cat([self.lanes, flag.to(torch.int64).reshape(1)])
        vals = both.tolist()  # the one sync
        return struct.pack("<QQQ", vals[0] & _U64, vals[1] & _U64, self.nbytes), bool(
            vals[2:] == [] or vals[2]
        )


def _hasher(algorithm: str):
    if algorithm == "xxh3":
        try:
            import xxhash
        except ImportError as e:  # a dependency of wandb, so normally present
            raise ImportError(
                "checksum 'xxh3' needs the xxhash package (pip install xxhash), or use 'sha256'"
            ) from e
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "mix128":
        return _Mix128()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; use one of {ALGORITHMS}")


def _sum_finite(chunk: torch.Tensor) -> torch.Tensor:
    """Whether the chunk's sum is finite (a 0-dim bool on the chunk's device, not read back).

    Exact together with `_recheck`, and fast when the answer is yes: a sum is finite unless a value
    is NaN/Inf or the sum overflows, so only a chunk with a non-finite sum (rare: fp16 sums can
    overflow) pays for the elementwise check. A reduction runs ~20x faster than `isfinite(...).all()`
    here (one core, 1 MiB chunks)."""
    total = chunk.sum(dtype=torch.float32) if chunk.dtype == torch.float16 else chunk.sum()  # fp16 max: 65504
    return torch.isfinite(total)


def _recheck(flat: torch.Tensor, step: int, sums_ok: torch.Tensor) -> bool:
    """The elementwise check of the chunks whose sum was not finite (the rare path)."""
    for i in (~sums_ok).nonzero().flatten().tolist():
        if not bool(torch.isfinite(flat[i * step : (i + 1) * step]).all()):
            return False
    return True


def digest_finite(t: torch.Tensor, algorithm: str = "xxh3", check: bool = True) -> tuple[bytes, bool]:
    """(digest of the tensor's bytes, whether every value is finite), in one chunked pass.

    With mix128 on the device, nothing is read back per chunk: one sync per tensor (plus one more
    only when a chunk's sum is not finite)."""
    h = _hasher(algorithm)
    flat = t.contiguous().reshape(-1)
    floating = check and (flat.is_floating_point() or flat.is_complex())
    chunk_bytes = _CHUNK_BYTES_CUDA if flat.device.type == "cuda" else _CHUNK_BYTES
    step = max(2, chunk_bytes // max(flat.element_size(), 1))
    sums_ok: list[torch.Tensor] = []
    for start in range(0, flat.numel(), step):
        chunk = flat[start : start + step]
        if isinstance(h, _Mix128):
            h.update(as_bytes(chunk))
        else:
            h.update(as_bytes(chunk).cpu().numpy())
        if floating:
            sums_ok.append(_sum_finite(chunk))
    ok = torch.stack(sums_ok) if sums_ok else None
    flag = ok.all() if ok is not None else None
    if isinstance(h, _Mix128):
        out, finite = h.digest(flag)  # lanes and flag in one read back
    else:
        out, finite = h.digest(), flag is None or bool(flag)
    if not finite:
        finite = _recheck(flat, step, ok)
    return out, finite


def digest(t: torch.Tensor, algorithm: str = "xxh3") -> bytes:
    """Digest of a tensor's bytes (row-major order; copies only when `t` is not contiguous)."""
    return digest_finite(t, algorithm, check=False)[0]
