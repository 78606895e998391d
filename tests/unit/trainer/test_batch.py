"""Microbatches: grouped by length and padded each to its own longest (no pipeline), or one length for
all (pipeline p2p buffers); either way every value maps back to the caller's sequence."""

import pytest
import torch

from megatron_rl.trainer.batch import completion_values, make_microbatches, padded_length


def _batch():
    g = torch.Generator().manual_seed(0)
    lengths = [40, 9, 33, 12, 70, 11, 35, 10]
    seqs = [torch.randint(1, 100, (n,), generator=g).tolist() for n in lengths]
    plens = [n // 2 for n in lengths]
    extras = {
        "adv": [torch.arange(n - p, dtype=torch.float32) + i for i, (n, p) in enumerate(zip(lengths, plens))]
    }
    return seqs, plens, extras


def test_by_length_groups_similar_lengths_and_pads_each_to_its_own_longest():
    seqs, plens, extras = _batch()
    mbs = make_microbatches(seqs, plens, 2, extras=extras, by_length=True)
    assert [mb.index for mb in mbs] == [[0, 4], [2, 6], [3, 5], [1, 7]]  # longest first
    assert [mb.tokens_BS.shape[1] for mb in mbs] == [72, 40, 16, 16]
    one = make_microbatches(seqs, plens, 2, extras=extras)
    padded = sum(mb.tokens_BS.numel() for mb in mbs)
    assert padded == 288 and sum(mb.tokens_BS.numel() for mb in one) == 8 * 72  # half the padded tokens
    for mb in mbs:
        for b, i in enumerate(mb.index):
            assert mb.tokens_BS[b, : len(seqs[i])].tolist() == seqs[i]
            assert int(mb.loss_mask_BT[b].sum()) == len(seqs[i]) - plens[i]


def test_values_map_back_to_the_callers_order_either_way():
    seqs, plens, extras = _batch()
    for by_length in (False, True):
        mbs = make_microbatches(seqs, plens, 2, extras=extras, by_length=by_length)
        back = completion_values([mb.extras["adv"] for mb in mbs], mbs, plens)
        assert all(torch.equal(b, e) for b, e in zip(back, extras["adv"])), by_length


def test_one_length_for_a_pipeline_and_no_mixing_of_the_two():
    seqs, plens, _ = _batch()
    mbs = make_microbatches(seqs, plens, 4)
    assert {mb.tokens_BS.shape[1] for mb in mbs} == {padded_length([len(s) for s in seqs])}
    with pytest.raises(ValueError, match="takes no seq_len"):
        make_microbatches(seqs, plens, 4, seq_len=80, by_length=True)
