"""Digests and validation: every kind of damage is named; identical bytes give identical manifests."""

import pytest
import torch

from megatron_rl.reshard.manifest import (
    Manifest,
    Run,
    default_algorithm,
    digest,
    digest_size,
    dtype_name,
    expected_manifest,
    validate,
)


@pytest.mark.parametrize("algorithm", ["xxh3", "sha256", "mix128"])
def test_digest_sees_every_byte_and_every_position(algorithm):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(257, 33, generator=g)
    d = digest(x, algorithm)
    assert digest(x.clone(), algorithm) == d
    raw = x.clone().reshape(-1).view(torch.uint8)
    for pos in (0, 1, 4097, raw.numel() - 1):  # any single flipped bit, anywhere
        flipped = raw.clone()
        flipped[pos] ^= 0x10
        assert digest(flipped, algorithm) != d
    swapped = x.clone()
    swapped[[3, 4]] = swapped[[4, 3]]  # same bytes, two rows exchanged
    assert digest(swapped, algorithm) != d
    assert digest(x[:-1], algorithm) != d  # a missing row
    # Row-major bytes: a column slice digests like its contiguous copy (what the wire carries).
    assert digest(x[:, 5:9], algorithm) == digest(x[:, 5:9].contiguous(), algorithm)


def test_mix128_handles_odd_byte_counts_and_bf16():
    x = torch.randn(7, dtype=torch.float32).to(torch.bfloat16)  # 14 bytes
    y = x.clone()
    y.view(torch.int16)[6] ^= 1
    assert digest(x, "mix128") != digest(y, "mix128")
    assert digest(torch.zeros(3, dtype=torch.uint8), "mix128") != digest(
        torch.zeros(4, dtype=torch.uint8), "mix128"
    )
    with pytest.raises(ValueError, match="sha256"):
        digest(x, "md4")
    assert default_algorithm("cpu") == "xxh3" and default_algorithm("cuda") == "mix128"
    assert len(digest(x, "xxh3")) == digest_size("xxh3") == 16 and digest_size("sha256") == 32


def _staged_and_expected(step=5):
    g = torch.Generator().manual_seed(1)
    full = torch.randn(6, 4, generator=g)
    emb = torch.cat([full, torch.zeros(2, 4)])  # two padding rows
    cols = torch.randn(4, 6, generator=g)
    staged = {"emb": emb, "o": cols}
    runs = {
        "emb": [Run(0, 0, 3, digest(full[:3])), Run(0, 3, 3, digest(full[3:])), Run(0, 6, 2, None)],
        "o": [Run(1, 0, 2, digest(cols[:, :2])), Run(1, 2, 4, digest(cols[:, 2:]))],
    }
    shapes = {n: tuple(t.shape) for n, t in staged.items()}
    return staged, expected_manifest(1, step, "xxh3", shapes, torch.float32, runs, 4), runs


def test_clean_version_validates_and_manifest_is_reproducible():
    staged, m, runs = _staged_and_expected()
    assert validate(staged, m, runs) == []
    _, again, _ = _staged_and_expected()
    assert again.same_weights(m) and again.to_dict() == m.to_dict()
    _, later, _ = _staged_and_expected(step=9)
    assert later.same_weights(m)  # same bytes from another step: same checksums
    assert {e.step for e in later.entries.values()} == {9}
    assert m.entries["emb"].dtype == dtype_name(torch.float32) == "float32"


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda s: s.pop("o"), "o: missing"),
        (lambda s: s.__setitem__("o", s["o"][:, :5].contiguous()), "o: shape [4, 5]"),
        (lambda s: s.__setitem__("o", s["o"].double()), "o: dtype float64"),
        (
            lambda s: s["o"].view(-1).view(torch.uint8)[17].bitwise_xor_(1),
            "o: checksum mismatch in columns 2..6",
        ),
        (lambda s: s["emb"].__setitem__((7, 0), 1e-30), "emb: padding rows 6..8 are not zero"),
        (
            lambda s: s["emb"].__setitem__([0, 4], s["emb"][[4, 0]]),
            "emb: checksum mismatch in rows 0..3, rows 3..6",
        ),
        (lambda s: s.__setitem__("extra", torch.zeros(1)), "unexpected tensors staged: ['extra']"),
    ],
)
def test_each_damage_is_reported(damage, message):
    staged, m, runs = _staged_and_expected()
    damage(staged)
    problems = validate(staged, m, runs)
    assert any(message in p for p in problems), problems


def test_manifest_serialises():
    _, m, _ = _staged_and_expected()
    d = m.to_dict()
    assert d["entries"]["emb"]["shape"] == [8, 4] and len(d["entries"]["emb"]["checksum"]) == 64
    assert isinstance(m, Manifest) and not m.same_weights(Manifest(1, 5, "xxh3", {}))
