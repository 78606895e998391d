"""Qwen3-MoE at TP2 x EP2 (x ETP2) with sequence parallelism on 4 GPUs (skipped with fewer): log-probs
equal transformers', and one distributed-optimizer step equals torch AdamW on the HF model, as the CPU
suite checks at TP1 x EP (tests/dist/trainer/test_foundation.py), whose oracles this reuses."""

import pytest
import torch

from megatron_rl.models.hf import megatron_full_to_hf
from megatron_rl.models.tiny import write_hf_checkpoint
from tests.dist.trainer.cases import TEMPERATURE, batch, moe_case_name
from tests.dist.trainer.test_foundation import _adamw_reference, _hf, _hf_logprobs
from tests.helpers.launch import torchrun
from tests.helpers.specs import QWEN3_MOE_TINY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4, reason="needs 4 GPUs"),
]
CASES = [(2, 1, 2, 1), (2, 1, 2, 2), (2, 1, 1, 1)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ckpt = write_hf_checkpoint(QWEN3_MOE_TINY, tmp_path_factory.mktemp("ckpt") / "moe", seed=7)
    out = tmp_path_factory.mktemp("out")
    torchrun("tests/gpu/worker_moe_tp_ep.py", 4, [str(out), str(ckpt)], timeout=900)
    return out, ckpt


@pytest.mark.parametrize("case", CASES, ids=lambda c: moe_case_name(*c))
def test_tp_ep_logprobs_and_one_step_match_the_hf_oracles(run, case):
    out, ckpt = run
    seqs, prompt_lens = batch()
    got = torch.load(out / f"logprobs_{moe_case_name(*case)}.pt")
    ref = _hf_logprobs(_hf(ckpt), seqs, prompt_lens, TEMPERATURE)
    assert max((g - r).abs().max().item() for g, r in zip(got, ref)) <= 1e-4
    want, _ = _adamw_reference(ckpt, seqs, prompt_lens)
    params = {}
    for name, t in torch.load(out / f"params_{moe_case_name(*case)}.pt").items():
        params.update(megatron_full_to_hf(QWEN3_MOE_TINY, name, t))
    assert max((params[n] - want[n]).abs().max().item() for n in want) <= 1e-4
