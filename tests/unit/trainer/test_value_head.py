"""A value model's head and read-outs (trainer/value.py) on one process: the per-token values line up with
teacher-forced log-probs (completion token j gets the value of the state before it) and a score is the
value after a sequence's last real token, whatever padding follows."""

import torch

from megatron_rl.trainer.batch import completion_values, make_microbatches
from megatron_rl.trainer.value import ValueHead, last_token_values, per_token_values


def _head(h=8, seed=0):
    head = ValueHead(h, torch.float32, sequence_parallel=False, device=torch.device("cpu"))
    with torch.no_grad():
        head.weight.copy_(torch.randn(1, h, generator=torch.Generator().manual_seed(seed)))
    return head


def test_a_fresh_head_predicts_zero_and_is_one_parameter_on_the_given_device():
    head = ValueHead(8, torch.float32, sequence_parallel=False, device=torch.device("cpu"))
    assert [tuple(p.shape) for p in head.parameters()] == [(1, 8)]
    assert next(head.parameters()).device.type == "cpu"
    out, bias = head(torch.randn(5, 2, 8))
    assert bias is None and out.shape == (5, 2, 1) and not out.any()


def test_head_is_a_linear_map_of_each_position_in_fp32():
    head = _head()
    hidden = torch.randn(6, 3, 8, dtype=torch.bfloat16)  # [S, B, h]
    out, _ = head(hidden)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, hidden.float() @ head.weight.float().T)


def test_values_sit_on_the_logprob_grid_and_scores_after_the_last_real_token():
    seqs, prompt_lens = [[5, 6, 7, 8, 9], [3, 4, 5]], [2, 1]
    mb = make_microbatches(seqs, prompt_lens, 2)[0]  # right-padded to 8
    S = mb.tokens_BS.shape[1]
    out_BS1 = (torch.arange(2 * S, dtype=torch.float32).reshape(2, S, 1) + 1) * torch.tensor(
        [1.0, -1.0]
    ).view(2, 1, 1)
    values = completion_values([per_token_values(out_BS1)], [mb], prompt_lens)
    # completion token j (position p + j) gets the value at position p + j - 1: the state before it
    assert [v.tolist() for v in values] == [out_BS1[0, 1:4, 0].tolist(), out_BS1[1, 0:2, 0].tolist()]
    scores = last_token_values(out_BS1, mb.lengths)
    assert scores.shape == (2, 1)
    assert scores[:, 0].tolist() == [out_BS1[0, 4, 0].item(), out_BS1[1, 2, 0].item()]
