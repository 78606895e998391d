"""The plan, executed in one process over every layout: engine tensors must equal vLLM's slices.

`simulate` copies each planned piece from a trainer shard (built by hf.py, as load_hf_into does)
into the engine rank's tensor. Uncovered rows stay NaN, so a gap, an overlap or a misplaced run
fails the byte comparison with the independent oracle.
"""

import itertools
from dataclasses import replace

import pytest
import torch

from megatron_rl.models.hf import expert_of
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.convert import bytes_equal, region
from megatron_rl.reshard.plan import Links, build_plan
from tests.helpers.specs import LLAMA_TINY_TIED, QWEN2_TINY, QWEN3_MOE_TINY, QWEN3_TINY
from tests.unit.reshard.oracle import expected_engine_tensors, megatron_shard, random_hf

GQA8 = replace(QWEN2_TINY, name="gqa8", num_attention_heads=8, head_dim=16, num_query_groups=4, num_layers=4)


def simulate(plan, hf):
    spec, lay = plan.spec, plan.layout
    padded = spec.padded_vocab(lay.tp)

    def shard(r, n):  # an expert's weights are split over the expert TP (hf.tp_of)
        if expert_of(n) is not None:
            return megatron_shard(spec, hf, n, lay.etp, lay.expert_coord(r).etp, padded)
        return megatron_shard(spec, hf, n, lay.tp, lay.trainer_coord(r).tp, padded)

    shards = {r: {n: shard(r, n) for n in names} for r, names in plan.sources.items()}
    out = {}
    for r, targets in plan.targets.items():
        out[r] = {}
        for name, t in targets.items():
            x = torch.full(t.shape, float("nan"))
            off = 0
            for s in t.segments:
                if s.hf is None:
                    region(x, t.dim, off, s.length).zero_()
                off += s.length
            out[r][name] = x
    for p in plan.pieces:
        src = region(shards[p.src][p.src_name], p.dim, p.src_off, p.length)
        dst = region(out[p.dst][p.dst_name], p.dim, p.dst_off, p.length)
        assert torch.isnan(dst).all(), f"piece overlaps another: {p}"
        dst.copy_(src)
    return out


def layouts():
    for tp, pp, dp, etp, colocated in itertools.product(
        [1, 2, 4], [1, 2], [1, 2], [1, 2, 4, 8], [True, False]
    ):
        world = tp * pp * dp
        count = max(1, world // etp) if colocated else 2
        if colocated and etp > world:
            continue
        yield ParallelLayout(
            tp=tp,
            pp=pp,
            dp=dp,
            engine_tp=etp,
            engine_count=count,
            placement="colocated" if colocated else "separated",
        )


def _fits(spec, lay):
    return spec.num_query_groups % lay.tp == 0 and spec.num_attention_heads % lay.engine_tp == 0


# GQA8 over every layout (in-place) and the small ones (loader: every engine rank gets the whole
# model); the other families (QKV bias, tied embeddings, QK norm) over the small layouts.
_SMALL = [lay for lay in layouts() if lay.dp == 1 and lay.engine_world * lay.trainer_world <= 8]
CASES = (
    [(GQA8, lay, "inplace") for lay in layouts() if _fits(GQA8, lay)]
    + [(GQA8, lay, "loader") for lay in _SMALL if _fits(GQA8, lay)]
    + [
        (spec, lay, d)
        for spec in (QWEN2_TINY, LLAMA_TINY_TIED, QWEN3_TINY)
        for lay in _SMALL[::2]
        for d in ("inplace", "loader")
        if _fits(spec, lay)
    ]
)


# Qwen3-MoE: experts from EP x ETP shards (every expert-DP replica holds them) into vLLM's fused MoE.
MOE_CASES = [
    (QWEN3_MOE_TINY, ParallelLayout(tp=1, pp=pp, dp=dp, ep=ep, etp=etp, engine_tp=et, engine_count=n, placement=pl), d)
    for (pp, dp, ep, etp, et, n, pl) in [
        (1, 4, 2, 1, 2, 2, "colocated"),
        (1, 4, 4, 1, 1, 4, "colocated"),
        (1, 4, 2, 2, 2, 2, "colocated"),
        (2, 2, 2, 1, 2, 2, "colocated"),
        (1, 2, 2, 1, 2, 1, "separated"),
    ]
    for d in ("inplace", "loader")
]  # fmt: skip
# Expert-parallel engines (layout.engine_ep): each engine rank holds 4 / engine_tp whole experts.
MOE_CASES += [
    (QWEN3_MOE_TINY, ParallelLayout(tp=1, pp=pp, dp=dp, ep=ep, engine_tp=et, engine_count=n, engine_ep=True), "inplace")
    for (pp, dp, ep, et, n) in [(1, 4, 2, 2, 2), (1, 4, 4, 4, 1), (2, 2, 2, 2, 2)]
]  # fmt: skip
CASES += MOE_CASES


@pytest.mark.parametrize("spec,lay,delivery", CASES, ids=lambda x: getattr(x, "name", None) or str(x))
def test_plan_delivers_exactly_the_engine_slices(spec, lay, delivery):
    hf = random_hf(spec, seed=3)
    plan = build_plan(lay, spec, delivery, Links(gpus_per_node=2), 4)
    got = simulate(plan, hf)
    for r, tensors in got.items():
        want = expected_engine_tensors(
            spec, hf, delivery, lay.engine_tp, lay.engine_coord(r).tp, lay.engine_ep
        )
        assert set(tensors) == set(want)
        for name, t in tensors.items():
            assert bytes_equal(t, want[name]), (r, name)
    # Bytes: each rank receives what it needs minus what it holds, and no padding byte moves.
    rb = plan.rank_bytes()
    for r in got:
        real = sum(
            s.length * t.unit * 4 for t in plan.targets[r].values() for s in t.segments if s.hf is not None
        )
        b = rb.get(r, {})
        assert b.get("recv_intra", 0) + b.get("recv_inter", 0) + b.get("local", 0) == real
    sent = sum(b["sent_intra"] + b["sent_inter"] for b in rb.values())
    recv = sum(b["recv_intra"] + b["recv_inter"] for b in rb.values())
    assert sent == recv == sum(p.nbytes for p in plan.pieces if p.src != p.dst)


def test_matching_tp_colocated_moves_only_vocab_rows():
    # Trainer TP = engine TP on the same ranks: every layer tensor is a local view or copy; only the
    # embedding and lm_head move, because megatron and vLLM pad the vocabulary differently.
    lay = ParallelLayout(tp=2, pp=1, dp=2, engine_tp=2, engine_count=2)
    plan = build_plan(lay, GQA8, "inplace", Links(gpus_per_node=4), 4)
    ops = plan.ops()
    for (r, name), op in ops.items():
        if name.startswith("model.layers.") or name == "model.norm.weight":
            assert op in ("view", "copy"), (r, name, op)
    assert {ops[(r, "model.layers.0.mlp.gate_up_proj.weight")] for r in range(4)} == {"view"}
    assert {ops[(r, "model.layers.0.self_attn.qkv_proj.weight")] for r in range(4)} == {
        "copy"
    }  # 2 groups/rank
    # Both sides pad the vocabulary 100 -> 128 here (64 rows per rank): nothing moves at all.
    assert plan.remote() == []
    # megatron padding to 128 x TP = 256 rows (128 per rank) vs vLLM's 128 (64 per rank): engine rank 1
    # needs rows 64..99, which trainer rank 0 holds -- 36 rows of each vocab tensor, nothing else.
    plan = build_plan(
        lay, replace(GQA8, make_vocab_size_divisible_by=128), "inplace", Links(gpus_per_node=4), 4
    )
    moved = [p for p in plan.pieces if p.src != p.dst]
    assert {p.dst_name for p in moved} == {"model.embed_tokens.weight", "lm_head.weight"}
    assert {(p.src % 2, p.dst % 2, p.hf_start, p.length, p.kind) for p in moved} == {
        (0, 1, 64, 36, "tp_gather")
    }


def test_sources_prefer_local_then_same_node_then_own_replica():
    # 2 DP replicas of TP2 on 4 ranks (2 per node); engines TP1 on every rank.
    lay = ParallelLayout(tp=2, pp=1, dp=2, engine_tp=1, engine_count=4)
    plan = build_plan(lay, GQA8, "inplace", Links(gpus_per_node=2), 4)
    for p in plan.pieces:
        if p.src != p.dst:
            assert plan.links.node(p.src) == plan.links.node(p.dst), p
            assert lay.trainer_coord(p.src).dp == lay.trainer_coord(p.dst).dp, p


def test_separated_spreads_load_over_replicas():
    lay = ParallelLayout(tp=1, pp=1, dp=2, engine_tp=1, engine_count=2, placement="separated")
    plan = build_plan(lay, GQA8, "inplace", Links(gpus_per_node=8), 4)
    rb = plan.rank_bytes()
    assert {p.kind for p in plan.pieces} == {"cross_pool"}
    assert abs(rb[0]["sent_intra"] - rb[1]["sent_intra"]) <= 0.2 * rb[0]["sent_intra"]


def test_lower_bound_is_the_busiest_link():
    lay = ParallelLayout(tp=1, pp=1, dp=1, engine_tp=1, engine_count=2, placement="separated")
    links = Links(gpus_per_node=2, intra_bytes_s=100.0, inter_bytes_s=10.0)
    plan = build_plan(lay, GQA8, "inplace", links, 4)
    full = (
        sum(t.numel for t in plan.targets[1].values()) * 4 - (128 - 100) * 128 * 4 * 2
    )  # minus vocab padding
    rb = plan.rank_bytes()
    assert rb[1]["recv_intra"] == full and rb[2]["recv_inter"] == full and rb[0]["sent_inter"] == full
    t, why = plan.lower_bound_s()
    assert t == pytest.approx(full / 10.0) and "inter-node" in why


def test_buckets_bound_bytes_per_rank():
    lay = ParallelLayout(tp=2, pp=2, dp=1, engine_tp=4, engine_count=1)
    plan = build_plan(lay, GQA8, "loader", Links(gpus_per_node=8), 4)
    cap = 40_000
    buckets = plan.buckets(cap)
    assert sorted(i for b in buckets for i in b) == plan.remote()
    assert plan.largest_piece_bytes() > cap  # so the oversized case is exercised
    for b in buckets:
        load, count = {}, {}
        for i in b:
            p = plan.pieces[i]
            for r in (p.src, p.dst):
                load[r] = load.get(r, 0) + p.nbytes
                count[r] = count.get(r, 0) + 1
        # A rank goes over the bucket only with one piece larger than the bucket, alone.
        assert all(load[r] <= cap or count[r] == 1 for r in load), load
    with pytest.raises(ValueError, match="positive"):
        plan.buckets(0)


def test_bad_layouts_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="engine_count"):
        build_plan(ParallelLayout(tp=2, engine_tp=2, engine_count=2), GQA8)
    with pytest.raises(ValueError, match="num_query_groups"):
        build_plan(ParallelLayout(tp=8, engine_tp=1), GQA8)
    with pytest.raises(ValueError, match="pp_layers"):
        build_plan(ParallelLayout(pp=2, engine_tp=1, pp_layers=(1, 1)), GQA8)


def test_uneven_pipeline_split():
    lay = ParallelLayout(tp=1, pp=2, dp=1, engine_tp=2, engine_count=1)
    plan = build_plan(lay.with_(pp_layers=(1, 3)), GQA8, "inplace", Links(), 4)
    assert {n for n in plan.sources[1] if n.startswith("decoder.layers.")} >= {
        "decoder.layers.3.mlp.linear_fc2.weight"
    }
    hf = random_hf(GQA8)
    got = simulate(plan, hf)
    want = expected_engine_tensors(GQA8, hf, "inplace", 2, 1)
    assert all(bytes_equal(got[1][n], want[n]) for n in want)
