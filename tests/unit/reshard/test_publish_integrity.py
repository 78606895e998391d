"""Publication refuses what must never be served; the previous version keeps serving (one process).

Each case: publish a good version 1, then a faulty version 2; it must be refused with a problem that
names the fault, version 1 must still be what the sink serves, and a clean publication afterwards
must activate (the refusal leaves nothing behind).
"""

import pytest
import torch

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.convert import bytes_equal
from megatron_rl.reshard.manifest import Run, coverage_problems
from megatron_rl.reshard.publish import InMemorySink, Publisher
from tests.helpers.specs import QWEN2_TINY as SPEC
from tests.unit.reshard.oracle import random_hf
from tests.unit.reshard.test_publish_local import CorruptingSink, _trainer

NORM = "decoder.final_layernorm.weight"


def _setup(algorithm=None, sink=None):
    params = _trainer(random_hf(SPEC))
    sink = sink or InMemorySink()
    pub = Publisher(ParallelLayout(), SPEC, sink, algorithm=algorithm)
    assert pub.publish(params.items(), step=0).activated
    served = {n: t.clone() for n, t in sink.tensors().items()}
    return params, sink, pub, served


def _refused_and_v1_serves(r, sink, served, message):
    assert not r.activated and any(message in p for p in r.problems), r.problems
    assert sink.active_version == 1 and r.active_version == 1
    assert all(bytes_equal(sink.tensors()[n], served[n]) for n in served)


@pytest.mark.parametrize("algorithm", ["xxh3", "mix128"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(algorithm, bad):
    params, sink, pub, served = _setup(algorithm)
    params["decoder.layers.1.mlp.linear_fc2.weight"][3, 7] = bad
    r = pub.publish(params.items(), step=1)
    _refused_and_v1_serves(r, sink, served, "down_proj.weight: non-finite values (NaN or Inf) in")
    params["decoder.layers.1.mlp.linear_fc2.weight"][3, 7] = 0.5
    assert pub.publish(params.items(), step=1).activated


def test_duplicated_name_is_refused():
    params, sink, pub, served = _setup()
    named = [*params.items(), (NORM, torch.zeros_like(params[NORM]))]  # the second copy: zeros
    r = pub.publish(named, step=1)
    _refused_and_v1_serves(r, sink, served, f"passed ['{NORM}'] more than once")
    assert pub.publish(params.items(), step=1).activated


@pytest.mark.parametrize("rewind", [1, 2, 0, -3])
def test_versions_that_do_not_increase_are_refused(rewind):
    params, sink, pub, served = _setup()
    assert pub.publish(params.items(), step=1).activated  # version 2 serves now
    served = {n: t.clone() for n, t in sink.tensors().items()}
    pub.next_version = rewind
    r = pub.publish(params.items(), step=2)
    assert not r.activated and any(
        f"version {rewind} does not increase on the active version 2" in p for p in r.problems
    )
    assert sink.active_version == 2 and all(bytes_equal(sink.tensors()[n], served[n]) for n in served)
    pub.next_version = 3
    assert pub.publish(params.items(), step=2).activated


def test_bytes_no_transfer_run_covers_are_refused():
    """A plan that forgets a piece: the bytes still arrive (the transfer moves it) but nothing checks them."""
    params, sink, pub, served = _setup()
    dropped = pub.plan.by_target[(0, "model.layers.1.self_attn.qkv_proj.weight")].pop(2)
    piece = pub.plan.pieces[dropped]
    r = pub.publish(params.items(), step=1)
    where = f"rows {piece.dst_off}..{piece.dst_off + piece.length} are covered by no transfer run"
    _refused_and_v1_serves(r, sink, served, f"qkv_proj.weight: {where}")


def test_plus_one_minus_two_plus_one_in_staged_bytes_is_refused_by_mix128():
    sink = CorruptingSink()
    params, sink, pub, served = _setup("mix128", sink)

    def damage(staged):
        words = staged["model.layers.0.mlp.down_proj.weight"].view(-1).view(torch.int16)
        for j, d in enumerate((1, -2, 1)):
            words[100 + j] += d

    sink.damage = damage
    r = pub.publish(params.items(), step=1)
    _refused_and_v1_serves(r, sink, served, "down_proj.weight: checksum mismatch")


def test_coverage_gaps_overlaps_and_short_ends_are_named():
    ok = [Run(0, 0, 4, b"a"), Run(0, 4, 4, None)]
    assert coverage_problems("w", (8, 2), ok) == []
    assert coverage_problems("w", (8, 2), [Run(0, 0, 3, b"a"), Run(0, 4, 4, b"b")]) == [
        "w: rows 3..4 are covered by no transfer run"
    ]
    assert coverage_problems("w", (8, 2), [Run(0, 0, 5, b"a"), Run(0, 4, 4, b"b")]) == [
        "w: rows 4..5 are covered by two runs"
    ]
    assert coverage_problems("w", (2, 8), [Run(1, 0, 6, b"a")]) == [
        "w: columns 6..8 are covered by no transfer run"
    ]
    assert coverage_problems("w", (8, 2), []) == ["w: no transfer run covers any of its bytes"]
    assert "several dimensions" in coverage_problems("w", (8, 8), [Run(0, 0, 8, b"a"), Run(1, 0, 8, b"b")])[0]
