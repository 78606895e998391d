"""torchrun worker (4 processes) for the trainer's multi-process checks, sharing one megatron import.

  torchrun --nproc-per-node 4 worker_foundation.py OUT_DIR CKPT_ROOT

For each (family, TP, PP) case: build the trainer from the HF checkpoint CKPT_ROOT/<spec name>,
compute teacher-forced log-probs; then one optimizer step at TP2 (DP2) and TP2xPP2 (DP1); then try
malformed checkpoints. Rank 0 (and stage leaders) write results into OUT_DIR for the test to check.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.checkpoint.export import full_state
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.trainer.hf_import import CheckpointError, load_hf_into
from megatron_rl.trainer.parallel import init_parallel, launched_world
from megatron_rl.trainer.policy import OptimSettings, Policy
from tests.dist.trainer.cases import (
    LOGPROB_CASES,
    MOE_LOGPROB_CASES,
    MOE_TRAIN_CASES,
    OPTIM,
    TEMPERATURE,
    TRAIN_CASES,
    advantages,
    batch,
    moe_case_name,
    reinit,
    train_loss,
)
from tests.helpers.specs import QWEN3_MOE_TINY, SPECS

OUT, CKPTS = Path(sys.argv[1]), Path(sys.argv[2])


def main() -> None:
    st = init_parallel(ParallelLayout.over(launched_world(), 1, 1))
    rank = st.env.rank
    seqs, prompt_lens = batch()
    for spec_name, tp, pp, mbs in LOGPROB_CASES:
        spec = SPECS[spec_name]
        st = reinit(tp, pp)
        pol = Policy(spec, st, micro_batch_size=mbs)
        load_hf_into(pol.model, spec, CKPTS / spec_name, tp, st.tp_rank, pol.padded_vocab)
        lps = pol.logprobs(seqs, prompt_lens, temperature=TEMPERATURE)
        if rank == 0:
            torch.save(lps, OUT / f"logprobs_{spec_name}_tp{tp}pp{pp}mbs{mbs}.pt")

    for tp, pp, ep, etp in MOE_LOGPROB_CASES:  # Qwen3-MoE at every expert layout that fits 4 processes
        spec = QWEN3_MOE_TINY
        st = reinit(tp, pp, ep, etp, sequence_parallel=tp > 1)
        pol = Policy(spec, st)
        load_hf_into(
            pol.model, spec, CKPTS / spec.name, tp, st.tp_rank, pol.padded_vocab, etp, st.expert_coord.etp
        )
        lps = pol.logprobs(seqs, prompt_lens, temperature=TEMPERATURE)
        full = full_state(pol)  # the HF export's gather, experts from every EP x ETP rank
        if rank == 0:
            torch.save(lps, OUT / f"logprobs_moe_{moe_case_name(tp, pp, ep, etp)}.pt")
            torch.save(full, OUT / f"export_moe_{moe_case_name(tp, pp, ep, etp)}.pt")

    train_cases = [(SPECS["qwen2_tiny"], (tp, pp, 1, 1), f"tp{tp}pp{pp}") for tp, pp in TRAIN_CASES]
    train_cases += [(QWEN3_MOE_TINY, c, "moe_" + moe_case_name(*c)) for c in MOE_TRAIN_CASES]
    for spec, (tp, pp, ep, etp), tag in train_cases:
        st = reinit(tp, pp, ep, etp, sequence_parallel=spec.is_moe and tp > 1)
        pol = Policy(spec, st, optim=OptimSettings(**OPTIM))
        load_hf_into(
            pol.model, spec, CKPTS / spec.name, tp, st.tp_rank, pol.padded_vocab, etp, st.expert_coord.etp
        )
        # Each DP rank trains on its contiguous share; the loss is normalised by the global token count.
        n = len(seqs) // st.dp
        mine = slice(st.dp_rank * n, (st.dp_rank + 1) * n)
        global_tokens = float(sum(len(s) - p for s, p in zip(seqs, prompt_lens)))
        adv = advantages(seqs, prompt_lens)[mine]
        before = pol.logprobs(seqs[mine], prompt_lens[mine])
        metrics, forward = pol.train_step(
            seqs[mine],
            prompt_lens[mine],
            train_loss(global_tokens),
            extras={"adv": adv},
            return_logprobs=True,
        )
        after = pol.logprobs(seqs[mine], prompt_lens[mine])
        full = full_state(pol)  # the whole model on rank 0 (the HF export's own gather)
        if rank == 0:
            torch.save(full, OUT / f"params_{tag}.pt")
            # The update's own forward (algorithm.old_logprobs=auto) against separate passes around it.
            torch.save({"before": before, "forward": forward, "after": after}, OUT / f"forward_{tag}.pt")
        if rank == dist.get_world_size() - 1:
            (OUT / f"metrics_{tag}.json").write_text(json.dumps(metrics))

    # Malformed checkpoints: refused, naming the tensor, with the model untouched.
    spec = SPECS["qwen2_tiny"]
    st = reinit(2, 1)
    pol = Policy(spec, st)
    load_hf_into(pol.model, spec, CKPTS / spec.name, 2, st.tp_rank, pol.padded_vocab)
    before = {n: p.detach().clone() for n, p in pol.named_parameters_global()}
    results = {}
    for bad in sorted(p for p in CKPTS.iterdir() if p.name.startswith("bad_")):
        try:
            load_hf_into(pol.model, spec, bad, 2, st.tp_rank, pol.padded_vocab)
            msg = None
        except CheckpointError as e:
            msg = str(e)
        unchanged = all(torch.equal(before[n], p) for n, p in pol.named_parameters_global())
        results[bad.name] = {"error": msg, "unchanged": unchanged}
    if rank == 0:
        (OUT / "malformed.json").write_text(json.dumps(results, indent=1))
    dist.barrier()


if __name__ == "__main__":
    main()
