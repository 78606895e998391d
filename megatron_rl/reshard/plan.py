"""The reshard plan: which trainer rank sends which bytes to which engine rank, and what it costs.

Pure Python (no torch.distributed, no tensors): it runs in `megatron-rl reshard-plan` on a laptop
and, cached, inside every rank of a job, where all ranks derive the same plan and so agree on every
message without negotiating.

The unit is a `Piece`: a run of rows (columns for row-parallel weights) that one trainer rank
holds and one engine rank needs, found by intersecting both sides' HF-row layouts (convert.py).
An engine rank receives each byte it needs exactly once, from one holder chosen in this order: its
own shard (a local copy, no link); a rank on its node; a rank of its own model replica (DP/CP
index); the holder that has sent least so far (spreads the load over DP replicas). Bytes the
target does not need are never moved: vocabulary padding is zero-filled at the target, and a TP
shard only reaches the engine ranks whose slice overlaps it.

Piece kinds (how the bytes travel): `local` (same process), `tp_gather` (from a TP peer of the same
stage and replica), `pp_p2p` (from another pipeline stage), `replica_p2p` (same stage, another DP/CP
replica), `cross_pool` (separated placement: trainer pool -> engine pool). Per engine tensor, `view`
means it is one contiguous run of a local shard and `copy` a rearrangement of local runs (QKV
regrouping, padding); either way the staged tensor is a fresh snapshot (one memcpy), so the trainer
may step while the version waits for validation.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from megatron_rl.models.hf import expert_of, megatron_names
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel import rules
from megatron_rl.parallel.layout import ParallelLayout, TrainerCoord
from megatron_rl.reshard.convert import TensorLayout, engine_layouts, megatron_layout

KINDS = ("local", "tp_gather", "pp_p2p", "replica_p2p", "cross_pool")


@dataclass(frozen=True)
class Links:
    """Link rates of the cluster: NVLink per GPU inside a node, InfiniBand per node across nodes."""

    gpus_per_node: int = 8
    intra_bytes_s: float = 900e9
    inter_bytes_s: float = 400e9  # per node, all NICs together

    @classmethod
    def from_cluster(cls, c) -> Links:  # c: config.schema.ClusterConfig
        return cls(
            gpus_per_node=c.gpus_per_node,
            intra_bytes_s=c.nvlink_gbps * 1e9,
            inter_bytes_s=c.ib_gbps_per_nic * c.nics_per_node / 8 * 1e9,
        )

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, src: int, dst: int) -> str:
        if src == dst:
            return "local"
        return "intra" if self.node(src) == self.node(dst) else "inter"


class Piece(NamedTuple):
    """`length` rows along `dim`: src's shard `src_name` at src_off -> dst's tensor `dst_name` at dst_off.

    A tuple: plans of large jobs hold hundreds of thousands of pieces.
    """

    src: int
    src_name: str
    src_off: int
    dst: int
    dst_name: str
    dst_off: int
    dim: int
    length: int
    nbytes: int
    kind: str
    hf: str  # provenance (first HF tensor of the run), for reports
    hf_start: int


@dataclass
class ReshardPlan:
    layout: ParallelLayout
    spec: ModelSpec
    delivery: str
    links: Links
    dtype_bytes: int
    sources: dict[int, dict[str, TensorLayout]]  # trainer rank -> megatron global name -> its shard
    targets: dict[int, dict[str, TensorLayout]]  # engine rank -> engine tensor name -> layout
    pieces: list[Piece]
    by_target: dict[tuple[int, str], list[int]] = field(default_factory=dict)  # pieces, in dst order
    _rank_bytes: dict[int, dict[str, int]] | None = field(default=None, repr=False)
    _buckets: dict[int, list[list[int]]] = field(default_factory=dict, repr=False)
    _of_rank: dict[int, list[int]] | None = field(default=None, repr=False)

    # ---- what moves ----
    def remote(self) -> list[int]:
        return [i for i, p in enumerate(self.pieces) if p.src != p.dst]

    def pieces_of(self, rank: int) -> list[int]:
        """Pieces a rank sends or receives, in plan order."""
        if self._of_rank is None:
            self._of_rank = defaultdict(list)
            for i, p in enumerate(self.pieces):
                self._of_rank[p.src].append(i)
                if p.dst != p.src:
                    self._of_rank[p.dst].append(i)
        return self._of_rank.get(rank, [])

    def target_bytes(self, rank: int) -> int:
        """Bytes of the tensors an engine rank stages (padding included)."""
        return sum(t.numel for t in self.targets.get(rank, {}).values()) * self.dtype_bytes

    def rank_bytes(self) -> dict[int, dict[str, int]]:
        """Per rank: bytes sent/received per link class and copied locally (payload only)."""
        if self._rank_bytes is None:
            self._rank_bytes = self._count_rank_bytes()
        return self._rank_bytes

    def _count_rank_bytes(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = defaultdict(
            lambda: dict(sent_intra=0, sent_inter=0, recv_intra=0, recv_inter=0, local=0)
        )
        for p in self.pieces:
            link = self.links.link(p.src, p.dst)
            if link == "local":
                out[p.dst]["local"] += p.nbytes
            else:
                out[p.src][f"sent_{link}"] += p.nbytes
                out[p.dst][f"recv_{link}"] += p.nbytes
        return dict(out)

    def ops(self) -> dict[tuple[int, str], str]:
        """Per engine-rank tensor: 'view' / 'copy' when local, else the piece kinds it needs."""
        out = {}
        for (dst, name), idx in self.by_target.items():
            target = self.targets[dst][name]
            kinds = {self.pieces[i].kind for i in idx}
            if kinds == {"local"}:
                p = self.pieces[idx[0]]
                src = self.sources[p.src][p.src_name]
                whole_cols = p.dim == 0 or p.length == src.shape[1]
                padless = all(s.hf is not None for s in target.segments)
                out[(dst, name)] = "view" if len(idx) == 1 and whole_cols and padless else "copy"
            else:
                out[(dst, name)] = "+".join(k for k in KINDS if k in kinds)
        return out

    def lower_bound_s(self) -> tuple[float, str]:
        """The transfer time no schedule can beat: the busiest link's bytes over its rate."""
        best, why = 0.0, "nothing crosses a link"
        node_in: dict[int, int] = defaultdict(int)
        node_out: dict[int, int] = defaultdict(int)
        for r, b in self.rank_bytes().items():
            t = max(b["sent_intra"], b["recv_intra"]) / self.links.intra_bytes_s
            if t > best:
                best, why = t, f"intra-node link of rank {r}"
            node_in[self.links.node(r)] += b["recv_inter"]
            node_out[self.links.node(r)] += b["sent_inter"]
        for n in set(node_in) | set(node_out):
            t = max(node_in[n], node_out[n]) / self.links.inter_bytes_s
            if t > best:
                best, why = t, f"inter-node links of node {n}"
        return best, why

    def largest_piece_bytes(self) -> int:
        return max((p.nbytes for p in self.pieces), default=0)

    def largest_tensor_bytes(self) -> int:
        sizes = [
            t.numel for ts in list(self.targets.values()) + list(self.sources.values()) for t in ts.values()
        ]
        return max(sizes, default=0) * self.dtype_bytes

    def buckets(self, bucket_bytes: int) -> list[list[int]]:
        """Remote pieces in buckets: no rank sends plus receives more than `bucket_bytes` per bucket.

        A piece larger than the bucket travels alone, so temporaries stay under one bucket plus the
        largest tensor. Pieces keep plan order (tensor by tensor, all engine ranks at once), so every
        rank has work in every bucket.
        """
        if bucket_bytes <= 0:
            raise ValueError(f"bucket size must be positive, got {bucket_bytes}")
        if bucket_bytes in self._buckets:
            return self._buckets[bucket_bytes]
        out: list[list[int]] = []
        cur: list[int] = []
        load: dict[int, int] = defaultdict(int)
        for i in self.remote():
            p = self.pieces[i]
            if cur and (load[p.src] + p.nbytes > bucket_bytes or load[p.dst] + p.nbytes > bucket_bytes):
                out.append(cur)
                cur, load = [], defaultdict(int)
            cur.append(i)
            load[p.src] += p.nbytes
            load[p.dst] += p.nbytes
        if cur:
            out.append(cur)
        self._buckets[bucket_bytes] = out
        return out


# ---- building a plan ---------------------------------------------------------------------------


class _Holders:
    """The ranks holding one HF run, indexed for the source choice (local, node, replica, load)."""

    def __init__(self, cands: list[tuple[int, str, int]], links: Links, replica: dict[int, tuple[int, int]]):
        self.by_rank = {r: (name, off) for r, name, off in cands}
        self.by_node: dict[int, list[int]] = defaultdict(list)
        self.by_replica: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r in self.by_rank:
            self.by_node[links.node(r)].append(r)
            self.by_replica[replica[r]].append(r)


def _replica(layout: ParallelLayout, rank: int) -> tuple[int, int]:
    c = layout.trainer_coord(rank)
    return c.cp, c.dp


def _kind(layout: ParallelLayout, src: int, dst: int) -> str:
    if src == dst:
        return "local"
    if not layout.is_trainer(dst):
        return "cross_pool"
    s, d = layout.trainer_coord(src), layout.trainer_coord(dst)
    if s.pp != d.pp:
        return "pp_p2p"
    return "tp_gather" if (s.cp, s.dp) == (d.cp, d.dp) else "replica_p2p"


def engine_ranks(layout: ParallelLayout) -> list[int]:
    return [r for e in range(layout.engine_count) for r in layout.engine_ranks(e)]


def build_plan(
    layout: ParallelLayout,
    spec: ModelSpec,
    delivery: str = "inplace",
    links: Links | None = None,
    dtype_bytes: int | None = None,
) -> ReshardPlan:
    """Plan the publication of a trainer layout's weights to its engines."""
    links = links or Links()
    dtype_bytes = dtype_bytes or spec.dtype_bytes
    # The layout's own rules (what `validate` applied to the recipe), less the cluster and the driver's.
    problems = rules.size_problems(layout) or [
        p
        for p in rules.trainer_problems(layout, spec)
        + rules.engine_problems(layout.engine_tp, spec, layout.engine_ep)
        + rules.placement_problems(layout)
        if p.kind == "recipe"
    ]
    if problems:
        raise ValueError("; ".join(map(str, problems)))
    padded_vocab = spec.padded_vocab(layout.tp)

    # Trainer side: every rank's shards, and the holders of each HF run: every (rank, tensor, offset)
    # holding those rows -- DP/CP replicas, and all TP ranks for replicated tensors such as norms.
    sources: dict[int, dict[str, TensorLayout]] = {}
    runs: dict[str, dict[tuple[int, int], list[tuple[int, str, int]]]] = defaultdict(dict)
    cache: dict[tuple[str, int], TensorLayout] = {}

    def hold(ranks: list[int], name: str, lay: TensorLayout) -> None:
        for r in ranks:
            sources.setdefault(r, {})[name] = lay
        # A tied last stage keeps a synced copy of the embedding; the first stage's is canonical.
        if name == "output_layer.weight" and spec.tie_word_embeddings:
            return
        off = 0
        for seg in lay.segments:
            if seg.hf is not None:
                runs[seg.hf].setdefault((seg.start, seg.length), []).extend((r, name, off) for r in ranks)
            off += seg.length

    for p in range(layout.pp):
        layers = layout.stage_range(spec.num_layers, p)
        names = megatron_names(spec, layers, p == 0, p == layout.pp - 1)
        for s in range(layout.tp):
            ranks = [
                layout.trainer_rank(TrainerCoord(s, c, d, p))
                for d in range(layout.dp)
                for c in range(layout.cp)
            ]
            for name in names:
                if expert_of(name) is None:
                    lay = cache.setdefault((name, s), megatron_layout(spec, name, layout.tp, s, padded_vocab))
                    hold(ranks, name, lay)
        # An MoE model's experts: EP rank e holds experts [e*E/EP, (e+1)*E/EP), split over the expert TP,
        # on every expert-DP replica (the expert grid's own coordinates: layout.expert_coord).
        if spec.is_moe:
            per_ep = spec.num_experts // layout.ep
            grid: dict[tuple[int, int], list[int]] = defaultdict(list)
            for r in range(layout.trainer_world):
                c = layout.expert_coord(r)
                if c.pp == p:
                    grid[(c.ep, c.etp)].append(r)
            for (e, t), ranks in sorted(grid.items()):
                for name in names:
                    if expert_of(name) is not None and expert_of(name) // per_ep == e:
                        hold(ranks, name, megatron_layout(spec, name, layout.etp, t, padded_vocab))
    replica = {r: _replica(layout, r) for r in range(layout.trainer_world)}
    holders = {}
    for hf, by_run in runs.items():
        entries = [(run, _Holders(c, links, replica)) for run, c in sorted(by_run.items())]
        holders[hf] = ([run[0] for run, _ in entries], entries)

    # Engine side, tensor by tensor across all engine ranks (keeps every rank busy in every bucket).
    e_ranks = engine_ranks(layout)
    by_tp = {
        t: {lay.name: lay for lay in engine_layouts(spec, delivery, layout.engine_tp, t, layout.engine_ep)}
        for t in range(layout.engine_tp)
    }  # layouts depend on the engine TP rank only; engines share them
    targets = {r: by_tp[layout.engine_coord(r).tp] for r in e_ranks}
    sent: dict[int, int] = defaultdict(int)
    pieces: list[Piece] = []
    by_target: dict[tuple[int, str], list[int]] = {}

    def choose(h: _Holders, dst: int) -> tuple[int, str, int]:
        if dst in h.by_rank:
            return (dst, *h.by_rank[dst])
        pool = h.by_node.get(links.node(dst))
        if pool:
            pool = [r for r in pool if replica[r] == replica.get(dst)] or pool
        else:
            pool = h.by_replica.get(replica.get(dst)) or list(h.by_rank)
        src = min(pool, key=lambda r: (sent[r], r))
        return (src, *h.by_rank[src])

    kind_of = functools.cache(lambda src, dst: _kind(layout, src, dst))
    names = list(targets[e_ranks[0]]) if e_ranks else []
    for name in names:
        for dst in e_ranks:
            tgt = targets[dst][name]
            idx: list[int] = []
            off, row_bytes = 0, tgt.unit * dtype_bytes
            for seg in tgt.segments:
                if seg.hf is not None:
                    _cover(seg, off, tgt, dst, holders, choose, sent, pieces, idx, kind_of, row_bytes)
                off += seg.length
            by_target[(dst, name)] = idx
    return ReshardPlan(layout, spec, delivery, links, dtype_bytes, sources, targets, pieces, by_target)


def _cover(seg, off, tgt, dst, holders, choose, sent, pieces, idx, kind_of, row_bytes) -> None:
    """Pieces for one target segment: intersect it with the holders' runs of the same HF tensor."""
    a, b = seg.start, seg.start + seg.length
    covered = a
    starts, entries = holders.get(seg.hf, ([], []))
    first = max(0, bisect.bisect_right(starts, a) - 1)
    for (h_start, h_len), h in entries[first:]:
        if h_start >= b:
            break
        lo, hi = max(a, h_start), min(b, h_start + h_len)
        if lo >= hi:
            continue
        if lo != covered:
            break
        src, src_name, src_off = choose(h, dst)
        length = hi - lo
        nbytes = length * row_bytes
        p = Piece(
            src,
            src_name,
            src_off + lo - h_start,
            dst,
            tgt.name,
            off + lo - a,
            tgt.dim,
            length,
            nbytes,
            kind_of(src, dst),
            seg.hf,
            lo,
        )
        last = pieces[idx[-1]] if idx else None
        if (
            last is not None
            and last.src == src
            and last.src_name == src_name
            and last.src_off + last.length == p.src_off
            and last.dst_off + last.length == p.dst_off
        ):
            pieces[idx[-1]] = last._replace(length=last.length + length, nbytes=last.nbytes + nbytes)
        else:
            idx.append(len(pieces))
            pieces.append(p)
        if src != dst:
            sent[src] += nbytes
        covered = hi
    if covered != b:
        raise RuntimeError(f"no trainer rank holds rows {covered}..{b} of {seg.hf} (needed by {tgt.name})")
