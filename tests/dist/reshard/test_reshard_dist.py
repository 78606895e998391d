"""The reshard across real processes (gloo, 4 ranks, one torchrun for every case; ~2-3 min on 2 cores).

Oracles: engine tensors equal, byte for byte, the slices vLLM's loader rules cut from the HF
checkpoint the trainer loaded (tests/unit/reshard/oracle.py); an HF model built from each engine's
tensors gives the megatron trainer's log-probs; the bytes each rank moved, counted in the transfer,
equal the plan's; faults reject the staged version on every rank and leave the served one intact.
"""

import json

import pytest

from megatron_rl.models.tiny import write_hf_checkpoint
from tests.dist.reshard.cases import SPECS, all_cases
from tests.helpers.launch import torchrun

pytestmark = pytest.mark.slow
WORKER = "tests/dist/reshard/worker.py"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    ckpts, out = tmp_path_factory.mktemp("ckpts"), tmp_path_factory.mktemp("out")
    for i, spec in enumerate(SPECS.values()):
        write_hf_checkpoint(spec, ckpts / spec.name, seed=10 + i)
    torchrun(WORKER, 4, [str(out), str(ckpts)], timeout=900)
    recs: dict[str, list[dict]] = {}
    for r in range(4):
        for rec in json.loads((out / f"rank{r}.json").read_text()):
            recs.setdefault(rec["case"], []).append(rec)
    return recs


def test_every_case_ran_on_every_rank(records):
    assert [r["missing"] for r in records["coverage"]] == [[]] * 4
    keys = {c.key for c in all_cases()}
    assert len(keys) == 78 + 18 and keys <= set(records)  # 18: the MoE model's
    assert all(len(records[k]) == 4 for k in keys)


@pytest.mark.parametrize("key", sorted(c.key for c in all_cases()))
def test_case(records, key):
    recs = records[key]
    for r in recs:
        assert r["activated"] == [True, True, True], (r["rank"], r["problems"])
        assert r["mismatch"] == [], (
            f"rank {r['rank']}: engine tensors differ from the HF slices: {r['mismatch']}"
        )
        assert r["mismatch_scaled"] == [], (
            f"rank {r['rank']}: second publication differs: {r['mismatch_scaled']}"
        )
        assert r["bytes_moved"] == r["bytes_plan"], (
            f"rank {r['rank']}: moved {r['bytes_moved']} != plan {r['bytes_plan']}"
        )
        assert r["peak_extra"] <= r["extra_bound"]
        assert r["versions"][:3] == [1, 2, 3]
        if r["engine"] is not None:
            assert r["versions"][3] == 3
            assert r["manifest_repeat_equal"] and r["manifest_scaled_differs"]
    lead = next(r for r in recs if r["rank"] == 0)
    assert lead["logprob_maxdiff"] <= 1e-5
    sent = sum(r["bytes_moved"]["sent_intra"] + r["bytes_moved"]["sent_inter"] for r in recs)
    recv = sum(r["bytes_moved"]["recv_intra"] + r["bytes_moved"]["recv_inter"] for r in recs)
    assert sent == recv
    if "_sep_" in key:
        assert sent > 0 and all(r["bytes_moved"]["local"] == 0 for r in recs)


FAULTS = {
    "dropped_tensor": "model.layers.0.self_attn.qkv_proj.weight: missing",
    "flipped_byte_in_transit": "checksum mismatch",
    "wrong_shape": "model.layers.1.mlp.down_proj.weight: shape",
}
TAGS = ["sep", "pp", "moe"]  # moe: Qwen3-MoE from EP2 x ETP2 shards; its wrong shape is one expert's slice


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_rejects_version_and_previous_serves(records, tag, fault):
    recs = records[f"fault_{tag}_{fault}"]
    expected = FAULTS[fault]
    if tag == "moe" and fault == "wrong_shape":
        expected = "model.layers.1.mlp.experts.routed_experts.w2_weight[3]: shape"
    assert len(recs) == 4
    for r in recs:
        assert r["activated"] is False
        # Every rank learns what went wrong, and where.
        assert any(p.startswith(f"rank {r['victim']}: ") and expected in p for p in r["problems"]), r[
            "problems"
        ]
        if r["active_version"] is not None:
            assert (
                r["active_version"] == 1
                and r["unchanged"]
                and r["manifest_unchanged"]
                and r["staged_left"] == 0
            )


@pytest.mark.parametrize("tag", TAGS)
def test_recovery_after_faults(records, tag):
    for r in records[f"fault_{tag}_recovered"]:
        assert r["activated"] and r["versions"] == [1, 5]
        assert r["same_manifest"] in (True, None)
