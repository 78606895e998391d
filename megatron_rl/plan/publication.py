"""Weight publication: the bytes, and the floor each network cut puts on moving them.

A publication gives every engine replica a full copy of the weights (W bytes) in its own TP layout.
What must move is what each GPU and each node needs but does not already hold. Weights are modelled
as a grid: PP stages (rows) x lcm(trainer TP, engine TP) column slices; a trainer rank holds one
row's TP slice, an engine rank needs its TP slice of every row. Ranks map to nodes in order
(trainer first when separated; megatron's tp-cp-dp-pp order, TP fastest). Then

  NVLink floor  max over GPUs of (needed - held on that GPU) / NVLink rate
  node floor    max over nodes of (needed - held on that node) / node IB (NICs x Gb/s / 8)
  cut floor     separated only: one copy must cross from trainer to engine nodes, over
                min(trainer nodes, engine nodes) x node IB

and publication.floor_s is the largest (all nodes receive in parallel: a lower bound). For intuition
the report also gives three schemes over one node's IB: one copy, k replicas through that one
bottleneck (a naive fan-out from one sender), and a binary broadcast tree (ceil(log2(k+1)) hops of a
full copy; pipelining it approaches one copy). Pack, install and validate come from the recipe.
"""

from __future__ import annotations

import math
from functools import lru_cache

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import PlanInputs
from megatron_rl.plan.wording import count


@lru_cache(maxsize=4096)
def _missing_fractions(
    tp: int, pp: int, cp: int, dp: int, etp: int, engines: int, colocated: bool, gpus_per_node: int
) -> tuple[float, float, int, int]:
    """(max missing fraction per engine GPU, per node, trainer nodes, engine nodes)."""
    # Rank coordinates come from the layout (its rank order), like the publisher's own plan.
    lay = ParallelLayout(
        tp=tp, pp=pp, cp=cp, dp=dp, engine_tp=etp, engine_count=engines,
        placement="colocated" if colocated else "separated",
    )  # fmt: skip
    cols = tp * etp // math.gcd(tp, etp)
    total = pp * cols
    kt, ke = cols // tp, cols // etp
    row_block = (1 << ke) - 1
    engine_masks = [sum(row_block << (row * cols + e * ke) for row in range(pp)) for e in range(etp)]

    def trainer_mask(r: int) -> int:
        c = lay.trainer_coord(r)
        return ((1 << kt) - 1) << (c.pp * cols + c.tp * kt)

    held_node: dict[int, int] = {}
    for r in range(lay.trainer_world):
        node = r // gpus_per_node
        held_node[node] = held_node.get(node, 0) | trainer_mask(r)
    need_node: dict[int, int] = {}
    gpu_missing = 0
    for r in range(lay.world_size):
        coord = lay.engine_coord(r)
        if coord is None:
            continue
        need = engine_masks[coord.tp]
        held = trainer_mask(r) if lay.is_trainer(r) else 0
        gpu_missing = max(gpu_missing, (need & ~held).bit_count())
        node = r // gpus_per_node
        need_node[node] = need_node.get(node, 0) | need
    node_missing = max((need & ~held_node.get(node, 0)).bit_count() for node, need in need_node.items())
    trainer_nodes = len(held_node)
    engine_nodes = len(need_node) if colocated else len(set(need_node) - set(held_node)) or 1
    return gpu_missing / total, node_missing / total, trainer_nodes, engine_nodes


def publication(inp: PlanInputs, layout: ParallelLayout) -> dict:
    hw, a = inp.hw, inp.assume
    w = float(inp.weights_bytes)
    gpu_frac, node_frac, t_nodes, e_nodes = _missing_fractions(
        layout.tp,
        layout.pp,
        layout.cp,
        layout.dp,
        layout.engine_tp,
        layout.engine_count,
        layout.colocated,
        hw.gpus_per_node,
    )
    cuts = [
        {
            "cut": "NVLink into one engine GPU",
            "bytes": gpu_frac * w,
            "gbps": hw.nvlink_bytes_per_s / 1e9,
            "floor_s": gpu_frac * w / hw.nvlink_bytes_per_s,
        },
        {
            "cut": "IB into one node",
            "bytes": node_frac * w,
            "gbps": hw.node_ib_bytes_per_s / 1e9,
            "floor_s": node_frac * w / hw.node_ib_bytes_per_s,
        },
    ]
    if not layout.colocated:
        cut_bw = min(t_nodes, e_nodes) * hw.node_ib_bytes_per_s
        cuts.append(
            {
                "cut": f"trainer -> engine pools ({count(min(t_nodes, e_nodes), 'node link')})",
                "bytes": w,
                "gbps": cut_bw / 1e9,
                "floor_s": w / cut_bw,
            }
        )
    floor = max(c["floor_s"] for c in cuts)
    k = layout.engine_count
    one = w / hw.node_ib_bytes_per_s
    extra = a.publish_pack_s + a.publish_install_s + a.publish_validate_s
    return {
        "bytes": w,
        "cuts": cuts,
        "floor_s": floor,
        "schemes": {
            "link_gbps": hw.node_ib_bytes_per_s / 1e9,
            "replicas": k,
            "one_copy_s": one,
            "k_replicas_one_bottleneck_s": k * one,
            "broadcast_tree_s": math.ceil(math.log2(k + 1)) * one,
        },
        "pack_s": a.publish_pack_s,
        "install_s": a.publish_install_s,
        "validate_s": a.publish_validate_s,
        "total_s": floor + extra,
    }
