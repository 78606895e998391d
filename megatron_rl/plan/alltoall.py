"""Mixture of experts: the token all-to-all of expert parallelism, in bytes per network cut and seconds.

With EP > 1 every MoE layer sends each token's hidden state (h x dtype bytes) to the EP ranks that
hold its top-k experts (dispatch) and the experts' outputs back (combine); backward does the same for
the gradients, and full recompute repeats the forward's. One copy per (token, expert) pair, as
megatron-core's all-to-all dispatcher sends them. Routing is taken as balanced: a copy lands on each of
the EP group's ranks with probability 1/EP, so a rank keeps 1/EP of its copies and sends the rest
to the group's other ranks: those on its own node over NVLink, those on other nodes over InfiniBand.

Per rank and all-to-all, with T tokens routed by the rank (its 1/TP slice with sequence parallelism,
1/CP, of a DP replica's microbatch):

    intra = T · k · h · B · (group ranks on its node - 1) / EP
    inter = T · k · h · B · (group ranks on other nodes)   / EP

Where the group's ranks sit follows megatron-core's expert grid (ETP fastest, then EP, expert-DP,
PP; the layout's `expert_coord`), ranks filling nodes in order. A step runs, per MoE layer of the
heaviest stage and per microbatch, 4 all-to-alls to train (6 with full recompute; once per pass,
algorithm.epochs) and 2 per log-prob forward. The two cuts work at once: a phase's all-to-all time
is the slower of NVLink bytes / NVLink rate (per GPU) and IB bytes of the node / node IB rate, plus
one collective latency per all-to-all. These seconds are added to the phase (train_fwd_bwd, old/ref log-probs):
the assumed MFU is that of dense compute and does not include them.
"""

from __future__ import annotations

import math
from functools import lru_cache

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import PlanInputs
from megatron_rl.plan.models import critic_recompute, critic_view, reward_view

TRAIN_PASSES = 4  # dispatch and combine forward, their gradients backward
RECOMPUTE_PASSES = 2  # full recompute reruns the forward's two
FORWARD_PASSES = 2


@lru_cache(maxsize=1024)
def _peers(layout: ParallelLayout, gpus_per_node: int) -> tuple[int, int]:
    """(other EP-group ranks on the same node, EP-group ranks on other nodes) for the worst rank."""
    stage = layout.tp * layout.cp * layout.dp
    if layout.ep == 1:
        return 0, 0
    if stage % (layout.ep * layout.etp):  # a layout `validate` refuses; groups taken as contiguous
        return min(layout.ep, gpus_per_node) - 1, max(0, layout.ep - gpus_per_node)
    groups: dict[tuple[int, int, int], list[int]] = {}
    for r in range(layout.trainer_world):
        c = layout.expert_coord(r)
        groups.setdefault((c.etp, c.edp, c.pp), []).append(r)
    worst = (0, 0)
    for members in groups.values():
        for r in members:
            node = r // gpus_per_node
            same = sum(1 for g in members if g != r and g // gpus_per_node == node)
            other = sum(1 for g in members if g // gpus_per_node != node)
            worst = max(worst, (same, other), key=lambda x: (x[1], x[0]))
    return worst


def tokens_per_rank(inp: PlanInputs, layout: ParallelLayout) -> float:
    """Tokens one rank routes per microbatch: its TP slice (sequence parallelism) and CP slice."""
    w = inp.work
    split = layout.cp * (layout.tp if layout.sequence_parallel or layout.tp == 1 else 1)
    return w.micro_batch_size * w.sequence_tokens / split


def alltoall(inp: PlanInputs, layout: ParallelLayout, microbatches: int, passes: int) -> dict:
    """Bytes and seconds of one rank's all-to-alls over `microbatches` microbatches of `passes`
    all-to-alls per MoE layer. Zeros for a dense model or EP 1 (tokens never leave the rank)."""
    s, hw = inp.spec, inp.hw
    zero = {"count": 0, "nvlink_bytes": 0.0, "ib_bytes": 0.0, "ib_bytes_per_node": 0.0, "seconds": 0.0}
    if not s.is_moe or layout.ep == 1 or microbatches == 0 or passes == 0:
        return zero
    same, other = _peers(layout, hw.gpus_per_node)
    layers = max(layout.stage_layers(s.num_layers))
    count = microbatches * layers * passes
    copy_bytes = tokens_per_rank(inp, layout) * s.moe_topk * s.hidden_size * s.dtype_bytes
    nvlink = count * copy_bytes * same / layout.ep
    ib = count * copy_bytes * other / layout.ep
    ranks_on_node = min(hw.gpus_per_node, layout.trainer_world)
    ib_node = ib * ranks_on_node
    seconds = max(nvlink / hw.nvlink_bytes_per_s, ib_node / hw.node_ib_bytes_per_s)
    return {
        "count": count,
        "nvlink_bytes": nvlink,
        "ib_bytes": ib,
        "ib_bytes_per_node": ib_node,
        "seconds": seconds + count * hw.allreduce_latency_s,
    }


def rank_microbatches(inp: PlanInputs, layout: ParallelLayout, sequences: int) -> int:
    """Microbatches one DP rank runs for a pass over `sequences` sequences."""
    return math.ceil(math.ceil(sequences / layout.dp) / inp.work.micro_batch_size)


def step_alltoall(inp: PlanInputs, layout: ParallelLayout) -> dict:
    """One step's all-to-all per trainer rank, by phase, and in total (what the report prints): the
    policy's training passes (algorithm.epochs of them), its log-prob forwards, and PPO's critic and a
    reward model when they are mixtures of experts too (each at its own shape and micro-batch size)."""
    w = inp.work
    per_minibatch = max(1, w.samples // w.minibatches)
    train_passes = TRAIN_PASSES + (RECOMPUTE_PASSES if layout.recompute == "full" else 0)
    steps = w.epochs * w.minibatches
    train = alltoall(inp, layout, steps * rank_microbatches(inp, layout, per_minibatch), train_passes)
    forward = alltoall(inp, layout, rank_microbatches(inp, layout, w.samples), FORWARD_PASSES)
    phases = {
        "train_fwd_bwd": train,
        "old_logprobs": forward if w.old_forward else alltoall(inp, layout, 0, 0),
        "ref_logprobs": forward if w.reference_forward else alltoall(inp, layout, 0, 0),
    }
    if inp.reward_model is not None:
        r = reward_view(inp)
        phases["reward_model"] = alltoall(r, layout, rank_microbatches(r, layout, w.samples), FORWARD_PASSES)
    if inp.critic is not None:
        c = critic_view(inp)
        passes = TRAIN_PASSES + (RECOMPUTE_PASSES if critic_recompute(inp, layout.recompute) == "full" else 0)
        phases["critic_values"] = alltoall(c, layout, rank_microbatches(c, layout, w.samples), FORWARD_PASSES)
        phases["critic_train"] = alltoall(
            c, layout, steps * rank_microbatches(c, layout, per_minibatch), passes
        )
    total = {k: sum(p[k] for p in phases.values()) for k in train}
    return {"ep": layout.ep, "etp": layout.etp, "phases": phases, **total}
