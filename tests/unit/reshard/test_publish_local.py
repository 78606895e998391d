"""The publisher in one process (trainer TP1 = engine TP1, all pieces local): versions, staging, faults.

The multi-process paths (collectives, PP, DP, separated pools) are in tests/dist/reshard.
"""

import re

import pytest
import torch

from megatron_rl.models.hf import megatron_names
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.convert import bytes_equal
from megatron_rl.reshard.publish import InMemorySink, Publisher
from tests.helpers.specs import QWEN2_TINY
from tests.unit.reshard.oracle import expected_engine_tensors, megatron_shard, random_hf

SPEC = QWEN2_TINY


def _trainer(hf):
    padded = SPEC.padded_vocab(1)
    # clone: hf.py returns replicated tensors (norms) as the HF tensor itself
    return {
        n: megatron_shard(SPEC, hf, n, 1, 0, padded).clone()
        for n in megatron_names(SPEC, range(SPEC.num_layers), True, True)
    }


class CorruptingSink(InMemorySink):
    """Damages what it stages (as a faulty copy or transport would) when armed."""

    def __init__(self):
        super().__init__()
        self.damage = None

    def stage(self, version, tensors):
        if self.damage is not None:
            self.damage(tensors)
        super().stage(version, tensors)


@pytest.mark.parametrize("delivery", ["inplace", "loader"])
def test_publish_activates_exact_tensors_and_snapshots_them(delivery):
    hf = random_hf(SPEC)
    params = _trainer(hf)
    sink = InMemorySink()
    pub = Publisher(ParallelLayout(), SPEC, sink, delivery=delivery)
    r = pub.publish(params.items(), step=0)
    assert r.activated and r.version == 1 and sink.active_version == 1 and r.problems == []
    want = expected_engine_tensors(SPEC, hf, delivery, 1, 0)
    assert set(sink.tensors()) == set(want)
    assert all(bytes_equal(sink.tensors()[n], want[n]) for n in want)
    assert r.stats.local == sum(t.numel() * 4 for n, t in want.items()) - 2 * (128 - 100) * 128 * 4 * (
        delivery == "inplace"
    )
    assert (
        r.stats.sent == {"intra": 0, "inter": 0} and r.stats.peak_extra_bytes <= 128 * 4 * 128
    )  # one column run
    # The engine holds a snapshot: the trainer stepping afterwards does not change what it serves.
    for t in params.values():
        t.mul_(2.0)
    assert all(bytes_equal(sink.tensors()[n], want[n]) for n in want)
    r2 = pub.publish(params.items(), step=1)
    assert r2.activated and r2.version == 2 and not r2.manifest.same_weights(r.manifest)


def test_same_weights_twice_give_identical_manifests_and_tensors():
    params = _trainer(random_hf(SPEC))
    sink = InMemorySink()
    pub = Publisher(ParallelLayout(), SPEC, sink)
    a = pub.publish(params.items(), step=4)
    first = {n: t.clone() for n, t in sink.tensors().items()}
    b = pub.publish(params.items(), step=4)
    assert b.version == a.version + 1
    assert b.manifest.entries == a.manifest.entries and b.manifest.same_weights(a.manifest)
    assert all(bytes_equal(sink.tensors()[n], first[n]) for n in first)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda s: s.pop("model.layers.1.mlp.down_proj.weight"), "down_proj.weight: missing"),
        (
            lambda s: s["model.layers.0.self_attn.qkv_proj.bias"].view(torch.uint8)[5].bitwise_xor_(4),
            "qkv_proj.bias: checksum",
        ),
        (lambda s: s.__setitem__("model.norm.weight", torch.zeros(127)), "model.norm.weight: shape [127]"),
    ],
)
def test_faulty_version_is_rejected_and_previous_one_serves(damage, message):
    params = _trainer(random_hf(SPEC))
    sink = CorruptingSink()
    pub = Publisher(ParallelLayout(), SPEC, sink)
    good = pub.publish(params.items(), step=1)
    served = {n: t.clone() for n, t in sink.tensors().items()}
    manifest = pub.active_manifest.to_dict()
    for t in params.values():
        t.add_(1.0)
    sink.damage = damage
    bad = pub.publish(params.items(), step=2)
    assert not bad.activated and bad.version == 2 and any(message in p for p in bad.problems), bad.problems
    assert sink.active_version == good.version == 1 and pub.active_manifest.to_dict() == manifest
    assert all(bytes_equal(sink.tensors()[n], served[n]) for n in served)
    assert sink._staged == {}  # the rejected version was dropped
    sink.damage = None
    again = pub.publish(params.items(), step=2)
    assert again.activated and again.version == 3  # a rejected version number is never reused


def test_bad_inputs_are_refused_and_named():
    params = _trainer(random_hf(SPEC))
    sink = InMemorySink()
    pub = Publisher(ParallelLayout(), SPEC, sink)
    assert pub.publish(params.items(), step=0).activated
    cases = [
        ([(n, t) for n, t in params.items() if "fc2" not in n], "did not pass.*named_parameters_global"),
        ([*params.items(), ("decoder.layers.9.mlp.linear_fc1.weight", torch.zeros(1))], "does not expect"),
        (
            dict(params, **{"decoder.final_layernorm.weight": torch.zeros(3)}).items(),
            "final_layernorm.weight has shape",
        ),
        (((n, t.double()) for n, t in params.items()), "dtype"),
    ]
    for named, message in cases:
        r = pub.publish(named, step=1)
        assert not r.activated and any(re.search(message, p) for p in r.problems), r.problems
        assert sink.active_version == 1 and r.active_version == 1 and r.stats.local == 0  # nothing moved
    with pytest.raises(RuntimeError, match="no sink"):
        Publisher(ParallelLayout(), SPEC).publish(params.items(), step=0)


def test_bf16_publication_is_byte_exact():
    from dataclasses import replace

    spec = replace(SPEC, params_dtype="bf16")
    hf = random_hf(spec, dtype=torch.bfloat16)
    padded = spec.padded_vocab(1)
    params = {
        n: megatron_shard(spec, hf, n, 1, 0, padded) for n in megatron_names(spec, range(2), True, True)
    }
    sink = InMemorySink()
    assert Publisher(ParallelLayout(), spec, sink).publish(params.items(), step=0).activated
    want = expected_engine_tensors(spec, hf, "inplace", 1, 0)
    assert all(
        sink.tensors()[n].dtype == torch.bfloat16 and bytes_equal(sink.tensors()[n], want[n]) for n in want
    )


class PlainSink:
    """A sink with only the required methods (no take_retired), like a live engine's."""

    def __init__(self):
        self.active_version, self.versions = None, {}

    def stage(self, version, tensors):
        self.versions[version] = tensors

    def staged(self, version):
        return self.versions[version]

    def activate(self, version):
        self.active_version = version

    def discard(self, version):
        self.versions.pop(version)


def test_retired_versions_are_reused_and_plain_sinks_get_fresh_memory():
    params = _trainer(random_hf(SPEC))
    sink = InMemorySink()
    pub = Publisher(ParallelLayout(), SPEC, sink)
    ptrs = []
    for step in range(3):
        for t in params.values():
            t.mul_(2.0)
        assert pub.publish(params.items(), step=step).activated
        ptrs.append({n: t.data_ptr() for n, t in sink.tensors().items()})
        want = _expected_now(params)
        assert all(bytes_equal(sink.tensors()[n], want[n]) for n in want)
    assert ptrs[2] == ptrs[0] and ptrs[1] != ptrs[0]  # v3 staged into v1's memory, v2 stayed served meanwhile
    plain = PlainSink()
    pub = Publisher(ParallelLayout(), SPEC, plain)
    pub.publish(params.items(), step=0)
    pub.publish(params.items(), step=1)
    a, b = plain.versions[1], plain.versions[2]
    assert all(a[n].data_ptr() != b[n].data_ptr() for n in a)


def _expected_now(params):
    """The engine tensors the current trainer shards imply (inverse of the megatron layout at TP1)."""
    from megatron_rl.models.hf import megatron_full_to_hf

    hf = {}
    for n, t in params.items():
        hf.update(megatron_full_to_hf(SPEC, n, t))
    return expected_engine_tensors(SPEC, hf, "inplace", 1, 0)
