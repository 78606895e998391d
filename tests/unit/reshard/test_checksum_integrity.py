"""Detection rate of the publication checksums on a fault model of small, structured errors.

The fault model: small multi-word perturbations of 16-bit words (the +1/-2/+1 pattern on three
consecutive words, and random zero-sum deltas on 2-4 consecutive words), swaps of two words or two
rows, and zeroed rows. Each fault changes the bytes (faults that change nothing are redrawn). A
position-weighted *linear* sum (the checksum mix128 replaced, rebuilt here) is run on the same
faults: it misses a large share of them, which shows the fault model has teeth, while mix128, xxh3
and sha256 must detect every one.
"""

import random

import pytest
import torch

from megatron_rl.reshard.checksum import default_algorithm, digest, digest_finite

ROWS, COLS = 32, 64  # bf16: 2048 16-bit words
TRIALS = 1500
_P31, _P61 = (1 << 31) - 1, (1 << 61) - 1


def linear_weighted_sum(t: torch.Tensor) -> bytes:
    """sum(word_i * (a*i + b) mod p) mod 2^61-1, two weightings: blind to second differences."""
    w = t.contiguous().reshape(-1).view(torch.int16).to(torch.int64) & 0xFFFF
    pos = torch.arange(1, w.numel() + 1, dtype=torch.int64)
    sums = [int((w * ((pos * a + b) % _P31)).sum()) % _P61 for a, b in ((1_000_003, 7), (2_147_483_589, 101))]
    return repr(sums).encode()


def _fault(x: torch.Tensor, rng: random.Random) -> tuple[str, torch.Tensor]:
    y = x.clone()
    words = y.view(-1).view(torch.int16)
    n = words.numel()
    kind = rng.choice(["+1-2+1", "zero_sum_deltas", "swap_words", "swap_rows", "zero_row"])
    if kind in ("+1-2+1", "zero_sum_deltas"):
        if kind == "+1-2+1":
            deltas = [1, -2, 1]
        else:
            k = rng.randint(2, 4)
            deltas = [rng.choice([-2, -1, 1, 2]) for _ in range(k - 1)]
            deltas.append(-sum(deltas))
        i = rng.randrange(n - len(deltas))
        for j, d in enumerate(deltas):
            v = (int(words[i + j]) + d) & 0xFFFF
            words[i + j] = v - 0x10000 if v >= 0x8000 else v
    elif kind == "swap_words":
        i, j = rng.sample(range(n), 2) if rng.random() < 0.5 else (k := rng.randrange(n - 1), k + 1)
        words[[i, j]] = words[[j, i]]
    elif kind == "swap_rows":
        a, b = rng.sample(range(ROWS), 2)
        y[[a, b]] = y[[b, a]]
    else:
        y[rng.randrange(ROWS)] = 0
    return kind, y


def _faults(seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < TRIALS:
        x = torch.randn(ROWS, COLS, generator=g).to(torch.bfloat16)
        kind, y = _fault(x, rng)
        if not torch.equal(x.view(torch.int16), y.view(torch.int16)):
            out.append((kind, x, y))
    return out


def _rate(faults, fn) -> tuple[float, dict[str, float]]:
    hit: dict[str, list[bool]] = {}
    for kind, x, y in faults:
        hit.setdefault(kind, []).append(fn(x) != fn(y))
    everything = [h for hs in hit.values() for h in hs]
    return sum(everything) / len(everything), {k: sum(v) / len(v) for k, v in hit.items()}


@pytest.fixture(scope="module")
def faults():
    return _faults(seed=14)


def test_fault_model_defeats_a_linear_weighted_sum(faults):
    """The control: without it a detection rate of 1.0 below could come from faults too easy to see."""
    rate, by_kind = _rate(faults, linear_weighted_sum)
    print(f"linear weighted sum: detection rate {rate:.4f} {by_kind}")
    assert by_kind["+1-2+1"] == 0.0, by_kind
    assert rate < 0.85, by_kind
    assert set(by_kind) == {"+1-2+1", "zero_sum_deltas", "swap_words", "swap_rows", "zero_row"}


@pytest.mark.parametrize("algorithm", ["mix128", "xxh3", "sha256"])
def test_every_fault_is_detected(faults, algorithm):
    rate, by_kind = _rate(faults, lambda t: digest(t, algorithm))
    print(f"{algorithm}: detection rate {rate:.4f} over {len(faults)} faults {by_kind}")
    assert rate == 1.0, by_kind


def test_mix128_is_position_dependent_and_length_aware():
    x = torch.zeros(4096, dtype=torch.uint8)
    x[10] = 1
    y = torch.zeros(4096, dtype=torch.uint8)
    y[12] = 1  # the same word value one word later
    assert digest(x, "mix128") != digest(y, "mix128")
    assert digest(torch.zeros(6, dtype=torch.uint8), "mix128") != digest(
        torch.zeros(7, dtype=torch.uint8), "mix128"
    )
    big = torch.randn(3 << 18)  # 3 MiB: crosses chunk boundaries
    assert digest(big, "mix128") != digest(torch.cat([big[:-1], big[-1:] + 1]), "mix128")
    assert default_algorithm("cuda") == "mix128"


@pytest.mark.parametrize("algorithm", ["mix128", "xxh3", "sha256"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_seen_while_hashing(algorithm, bad):
    x = torch.randn(1 << 19)  # two chunks: the bad value sits in the second
    d, finite = digest_finite(x, algorithm)
    assert finite and d == digest(x, algorithm)
    x[-3] = bad
    d2, finite = digest_finite(x, algorithm)
    assert not finite and d2 == digest(x, algorithm)
    assert digest_finite(torch.full((5,), 3, dtype=torch.int32), algorithm)[1]  # integers: always finite


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mix128_on_cuda_equals_cpu():
    x = torch.randn(1000, 33).to(torch.bfloat16)
    assert digest(x.cuda(), "mix128") == digest(x, "mix128")
    assert digest_finite(x.cuda(), "mix128")[1]
