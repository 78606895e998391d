"""Moving a plan's pieces into an engine rank's staging tensors: in memory, bucketed, point to point.

Three phases, run by every rank of the job with the same plan (so every send has its receive):
1. local pieces (the engine rank holds the trainer shard): one copy from the shard into the
   staged tensor, no link, no temporary (except a contiguous copy to digest a column run);
2. remote pieces, bucket by bucket (`ReshardPlan.buckets`): per (sender, receiver) pair, a large
   piece that is contiguous at both ends travels as its own message straight from the trainer's
   parameter into the staged tensor (no temporary); the rest are packed into one buffer per pair.
   One `batch_isend_irecv` per bucket (NCCL on GPU, gloo on CPU); senders digest their bytes
   while the bucket is in flight;
3. the senders' digests, one small message per pair, which validation checks the staged bytes
   against (manifest.py).

Why point to point rather than all_gather: targets rarely need all of every peer's shard (engine
TP != trainer TP, vocabulary paddings that differ, PP stages, DP replicas), and an all_gather
would move and hold bytes nobody needs. Where the pattern *is* an all-gather (loader delivery at
trainer TP = k, engine TP = 1), the batched sends move the same bytes; measured here (gloo,
4 processes) they were faster than gloo's ring all_gather (benchmarks/reshard.py).

Temporaries (pack and receive buffers) are counted as they are allocated and freed; their peak is
reported, and stays below one bucket plus the largest piece.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from megatron_rl.reshard.checksum import digest, digest_size
from megatron_rl.reshard.convert import as_bytes, region
from megatron_rl.reshard.plan import Piece, ReshardPlan

DIRECT_MIN_BYTES = 256 << 10  # smaller pieces are packed: per-message overhead beats a memcpy
_DIGEST_TAG = 1 << 20

# recv_hook(src_rank, payload_uint8): called on every received payload before it is unpacked
# (fault injection in tests; a real transport never sets it).
RecvHook = Callable[[int, torch.Tensor], None]


@dataclass
class TransferStats:
    sent: dict[str, int] = field(default_factory=lambda: {"intra": 0, "inter": 0})
    recv: dict[str, int] = field(default_factory=lambda: {"intra": 0, "inter": 0})
    local: int = 0
    digest_bytes: int = 0  # sent + received digest messages (overhead, not payload)
    buckets: int = 0
    messages: int = 0
    peak_extra_bytes: int = 0
    seconds: float = 0.0
    hash_seconds: float = 0.0


class _Meter:
    """Bytes of temporaries alive now, and the peak."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n: int) -> None:
        self.now -= n


def _direct(p: Piece, plan: ReshardPlan, min_bytes: int) -> bool:
    """Whether a piece travels as its own message (contiguous at both ends, large enough)."""
    if p.nbytes < min_bytes:
        return False
    src_shape = plan.sources[p.src][p.src_name].shape
    dst_shape = plan.targets[p.dst][p.dst_name].shape
    return p.dim == 0 or (p.length == src_shape[1] and p.length == dst_shape[1])


class _Messages:
    """The messages of one (sender, receiver) pair in one bucket: direct pieces, then one pack."""

    def __init__(self, plan: ReshardPlan, idx: list[int], direct_min_bytes: int):
        self.direct = [i for i in idx if _direct(plan.pieces[i], plan, direct_min_bytes)]
        direct = set(self.direct)
        self.packed = [i for i in idx if i not in direct]
        self.pack_bytes = sum(plan.pieces[i].nbytes for i in self.packed)


def _piece_view(buf: torch.Tensor, p: Piece, like: torch.Tensor) -> torch.Tensor:
    """`buf` (uint8, p.nbytes) seen as the piece's shape and dtype."""
    shape = list(like.shape)
    shape[p.dim] = p.length
    return buf.view(like.dtype).view(shape)


def run_transfer(
    plan: ReshardPlan,
    rank: int,
    sources: Mapping[str, torch.Tensor],
    staged: Mapping[str, torch.Tensor],
    bucket_bytes: int,
    algorithm: str = "xxh3",
    recv_hook: RecvHook | None = None,
    group: dist.ProcessGroup | None = None,
    direct_min_bytes: int = DIRECT_MIN_BYTES,
    device: torch.device | str = "cpu",
) -> tuple[dict[int, bytes], TransferStats]:
    """Fill this rank's staged tensors. Returns the senders' digests of the pieces it received."""
    t0 = time.perf_counter()
    st, meter = TransferStats(), _Meter()
    digests: dict[int, bytes] = {}
    mine = plan.pieces_of(rank)

    def src_region(p: Piece) -> torch.Tensor:
        return region(sources[p.src_name], p.dim, p.src_off, p.length)

    def dst_region(p: Piece) -> torch.Tensor:
        return region(staged[p.dst_name], p.dim, p.dst_off, p.length)

    # A source run sent to several receivers (loader delivery, replicated tensors) is hashed once.
    sent_digests: dict[tuple[str, int, int, int], bytes] = {}

    def source_digest(p: Piece, t: torch.Tensor) -> bytes:
        key = (p.src_name, p.dim, p.src_off, p.length)
        if key not in sent_digests:
            sent_digests[key] = timed_digest(t)
        return sent_digests[key]

    def timed_digest(t: torch.Tensor) -> bytes:
        h0 = time.perf_counter()
        if not t.is_contiguous():
            meter.alloc(t.numel() * t.element_size())
        d = digest(t, algorithm)
        if not t.is_contiguous():
            meter.free(t.numel() * t.element_size())
        st.hash_seconds += time.perf_counter() - h0
        return d

    # 1. local pieces
    for i in mine:
        p = plan.pieces[i]
        if p.src == p.dst == rank:
            src = src_region(p)
            dst_region(p).copy_(src)
            digests[i] = source_digest(p, src)
            st.local += p.nbytes

    # 2. remote pieces, bucket by bucket (on NCCL, the publisher's all_reduce before this has already
    # brought up the group, as batch_isend_irecv requires of a first call that not all ranks join)
    sent_to: dict[int, list[int]] = defaultdict(list)  # receiver -> pieces I sent (digest order)
    recv_from: dict[int, list[int]] = defaultdict(list)
    mine_set = set(mine)
    for bucket in plan.buckets(bucket_bytes):
        out: dict[int, list[int]] = defaultdict(list)
        inc: dict[int, list[int]] = defaultdict(list)
        for i in bucket:
            if i not in mine_set:
                continue
            p = plan.pieces[i]
            (out[p.dst] if p.src == rank else inc[p.src]).append(i)
        if not out and not inc:
            continue
        st.buckets += 1
        ops: list[dist.P2POp] = []
        to_hash: list[tuple[int, torch.Tensor]] = []
        unpack: list[tuple[int, torch.Tensor, list[int]]] = []
        held = 0
        for peer in sorted(out):
            msgs = _Messages(plan, out[peer], direct_min_bytes)
            for tag, i in enumerate(msgs.direct):
                view = as_bytes(src_region(plan.pieces[i]))
                ops.append(dist.P2POp(dist.isend, view, peer, group=group, tag=tag))
                to_hash.append((i, view))
                _count(st, plan, rank, peer, view.numel(), "sent")
            if msgs.packed:
                buf = torch.empty(msgs.pack_bytes, dtype=torch.uint8, device=device)
                meter.alloc(buf.numel())
                held += buf.numel()
                o = 0
                for i in msgs.packed:
                    p = plan.pieces[i]
                    src = src_region(p)
                    piece_buf = buf[o : o + p.nbytes]
                    _piece_view(piece_buf, p, src).copy_(src)
                    to_hash.append((i, piece_buf))
                    o += p.nbytes
                ops.append(dist.P2POp(dist.isend, buf, peer, group=group, tag=len(msgs.direct)))
                _count(st, plan, rank, peer, buf.numel(), "sent")
            sent_to[peer] += out[peer]
        for peer in sorted(inc):
            msgs = _Messages(plan, inc[peer], direct_min_bytes)
            for tag, i in enumerate(msgs.direct):
                view = as_bytes(dst_region(plan.pieces[i]))
                ops.append(dist.P2POp(dist.irecv, view, peer, group=group, tag=tag))
                unpack.append((peer, view, []))
                _count(st, plan, rank, peer, view.numel(), "recv")
            if msgs.packed:
                buf = torch.empty(msgs.pack_bytes, dtype=torch.uint8, device=device)
                meter.alloc(buf.numel())
                held += buf.numel()
                ops.append(dist.P2POp(dist.irecv, buf, peer, group=group, tag=len(msgs.direct)))
                unpack.append((peer, buf, msgs.packed))
                _count(st, plan, rank, peer, buf.numel(), "recv")
            recv_from[peer] += inc[peer]
        st.messages += len(ops)
        works = dist.batch_isend_irecv(ops)
        for i, t in to_hash:  # overlaps with the bucket in flight; sources are only read
            digests[i] = source_digest(plan.pieces[i], t)
        for w in works:
            w.wait()
        for peer, buf, packed in unpack:
            if recv_hook is not None:
                recv_hook(peer, buf)
            o = 0
            for i in packed:
                p = plan.pieces[i]
                dst = dst_region(p)
                dst.copy_(_piece_view(buf[o : o + p.nbytes], p, dst))
                o += p.nbytes
        meter.free(held)

    # 3. the senders' digests, in plan order per pair
    if sent_to or recv_from:
        ops, incoming, size = [], [], digest_size(algorithm)
        for peer in sorted(sent_to):
            msg = torch.frombuffer(
                bytearray(b"".join(digests.pop(i) for i in sent_to[peer])), dtype=torch.uint8
            )
            ops.append(dist.P2POp(dist.isend, msg.to(device), peer, group=group, tag=_DIGEST_TAG))
            st.digest_bytes += msg.numel()
        for peer in sorted(recv_from):
            buf = torch.empty(len(recv_from[peer]) * size, dtype=torch.uint8, device=device)
            ops.append(dist.P2POp(dist.irecv, buf, peer, group=group, tag=_DIGEST_TAG))
            incoming.append((peer, buf))
            st.digest_bytes += buf.numel()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for peer, buf in incoming:
            raw = buf.cpu().numpy().tobytes()
            for k, i in enumerate(recv_from[peer]):
                digests[i] = raw[k * size : (k + 1) * size]
    st.peak_extra_bytes = meter.peak
    st.seconds = time.perf_counter() - t0
    return {i: d for i, d in digests.items() if plan.pieces[i].dst == rank}, st


def _count(st: TransferStats, plan: ReshardPlan, rank: int, peer: int, nbytes: int, way: str) -> None:
    getattr(st, way)[plan.links.link(rank, peer)] += nbytes
