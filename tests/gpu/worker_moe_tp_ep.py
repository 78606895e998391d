"""torchrun worker (4 GPUs) for the MoE layouts the CPU suite cannot run: TP2 x EP2 with sequence
parallelism (megatron-core's MoE layer needs it at TP > 1; the CPU build's local spec refuses it) and the
alltoall dispatcher over NCCL (run by test_moe_tp_ep.py).

    torchrun --nproc-per-node 4 worker_moe_tp_ep.py OUT_DIR CKPT_DIR

Per layout: log-probs of tests/dist/trainer/cases.batch(), then one optimizer step's full parameters
(the HF export's gather), written by rank 0.
"""

import sys
from pathlib import Path

import torch

from megatron_rl.models.precision import strict_fp32
from megatron_rl.trainer.gather import full_state
from megatron_rl.trainer.hf_import import load_hf_into
from megatron_rl.trainer.policy import OptimSettings, Policy
from tests.dist.trainer.cases import OPTIM, TEMPERATURE, advantages, batch, moe_case_name, reinit, train_loss
from tests.helpers.specs import QWEN3_MOE_TINY

OUT, CKPT = Path(sys.argv[1]), Path(sys.argv[2])
CASES = [(2, 1, 2, 1), (2, 1, 2, 2), (2, 1, 1, 1)]  # (TP, PP, EP, ETP), sequence parallel on


def main() -> None:
    strict_fp32()  # fp32 compared at 1e-4: no TF32 in TE's GEMMs or torch's (before CUDA starts)
    spec = QWEN3_MOE_TINY
    seqs, prompt_lens = batch()
    for tp, pp, ep, etp in CASES:
        st = reinit(tp, pp, ep, etp, sequence_parallel=True)
        tag = moe_case_name(tp, pp, ep, etp)
        pol = Policy(spec, st, optim=OptimSettings(**OPTIM))
        load_hf_into(pol.model, spec, CKPT, tp, st.tp_rank, pol.padded_vocab, etp, st.expert_coord.etp)
        lps = pol.logprobs(seqs, prompt_lens, temperature=TEMPERATURE)
        n = len(seqs) // st.dp
        mine = slice(st.dp_rank * n, (st.dp_rank + 1) * n)
        tokens = float(sum(len(s) - p for s, p in zip(seqs, prompt_lens)))
        pol.train_step(
            seqs[mine],
            prompt_lens[mine],
            train_loss(tokens),
            extras={"adv": advantages(seqs, prompt_lens)[mine]},
        )
        full = full_state(pol)
        if st.env.rank == 0:
            torch.save([t.cpu() for t in lps], OUT / f"logprobs_{tag}.pt")
            torch.save(full, OUT / f"params_{tag}.pt")


if __name__ == "__main__":
    main()
