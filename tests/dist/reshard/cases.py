"""The reshard's multi-process cases (worker and test both import these): every layout that fits in 4.

Two tiny models cover the issue's axes: `qwen2_mha` (QKV bias, untied, 4 KV groups so trainer TP4
works, vocab 100 padded to 112/128 by megatron and 128 by vLLM) and `llama_gqa_tied` (2 KV groups:
engine TP4 replicates KV heads; tied embeddings; megatron pads the vocabulary to 144/192).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tests.helpers.specs import LLAMA_TINY_TIED, QWEN2_TINY, QWEN3_MOE_TINY

NPROC = 4
SPECS = {
    s.name: s
    for s in (
        replace(QWEN2_TINY, name="qwen2_mha", num_query_groups=4, make_vocab_size_divisible_by=16),
        replace(LLAMA_TINY_TIED, name="llama_gqa_tied", make_vocab_size_divisible_by=48),
        QWEN3_MOE_TINY,  # experts from EP x ETP shards (colocated: the expert grid spans DP)
    )
}
# (TP, PP, EP, ETP) of the MoE model's trainer: TP 1 (no sequence parallelism on CPU).
MOE_LAYOUTS = [(1, 1, 2, 1), (1, 1, 2, 2), (1, 2, 2, 1)]
BUCKET_BYTES = 24 << 10  # small: many buckets, and pieces larger than a bucket
GPUS_PER_NODE = 2  # ranks {0, 1} and {2, 3} count as two nodes: both link classes are exercised
SCALE = 2.0  # second publication: every weight doubled (exact in fp32)


@dataclass(frozen=True)
class Case:
    spec: str
    tp: int
    pp: int
    engine_tp: int
    engine_count: int
    colocated: bool
    delivery: str
    ep: int = 1
    etp: int = 1

    @property
    def dp(self) -> int:
        return NPROC // (self.tp * self.pp) if self.colocated else 1

    @property
    def key(self) -> str:
        place = "coloc" if self.colocated else "sep"
        experts = f"ep{self.ep}xtp{self.etp}" if SPECS[self.spec].is_moe else ""
        return f"{self.spec}_tp{self.tp}pp{self.pp}dp{self.dp}{experts}_etp{self.engine_tp}x{self.engine_count}_{place}_{self.delivery}"


def trainer_layouts(spec_name: str) -> list[tuple[int, int, int, int]]:
    """(TP, PP, EP, ETP) the spec's trainer runs at."""
    if SPECS[spec_name].is_moe:
        return MOE_LAYOUTS
    groups = SPECS[spec_name].num_query_groups
    return [(tp, pp, 1, 1) for tp in (1, 2, 4) for pp in (1, 2) if tp * pp <= NPROC and groups % tp == 0]


def placements(spec_name: str) -> tuple[bool, ...]:
    """Colocated and separated; an MoE trainer colocated only (a separated one here would be DP1, EP1)."""
    return (True,) if SPECS[spec_name].is_moe else (True, False)


def cases_for(spec_name: str, tp: int, pp: int, colocated: bool, ep: int = 1, etp: int = 1) -> list[Case]:
    out = []
    for etp_ in (1, 2, 4):  # the engine's TP
        if colocated:
            count = NPROC // etp_  # every rank serves
        else:
            count = (NPROC - tp * pp) // etp_  # the ranks the trainer leaves
        if count < 1:
            continue
        for delivery in ("inplace", "loader"):
            out.append(Case(spec_name, tp, pp, etp_, count, colocated, delivery, ep, etp))
    return out


def all_cases() -> list[Case]:
    return [
        c
        for name in SPECS
        for tp, pp, ep, etp in trainer_layouts(name)
        for colocated in placements(name)
        for c in cases_for(name, tp, pp, colocated, ep, etp)
    ]


def batch():
    """Sequences and prompt lengths for the log-prob comparison."""
    import torch

    g = torch.Generator().manual_seed(0)
    lengths, prompt_lens = [9, 14, 5], [3, 4, 2]
    return [torch.randint(0, 100, (n,), generator=g).tolist() for n in lengths], prompt_lens
