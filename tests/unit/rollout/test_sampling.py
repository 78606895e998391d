"""The sampling convention on a 4-token distribution whose values are worked out by hand.

The logits are z = 0.5 * log(q) with q = [0.5, 0.25, 0.15, 0.10], so at temperature 0.5 the
tempered distribution softmax(z / 0.5) is exactly q. The engine side of the same convention is
checked against the live vLLM CPU build in tests/integration/rollout/test_engine_cpu.py.
"""

import math

import pytest
import torch

from megatron_rl.rollout.sampling import (
    apply_sampling_convention,
    filter_logits,
    needs_full_vocab,
    token_logprobs_full_vocab,
    trainer_temperature,
)

Q = [0.5, 0.25, 0.15, 0.10]
LOGITS_V = torch.tensor([0.5 * math.log(q) for q in Q])
NEG_INF = float("-inf")


def _close(got, expected):
    got = got.tolist()
    for g, e in zip(got, expected):
        if e == NEG_INF:
            assert g == NEG_INF, (got, expected)
        else:
            assert g == pytest.approx(e, abs=1e-6), (got, expected)


def test_temperature_only_is_the_tempered_distribution():
    # T = 0.5, no filter: softmax(z / 0.5) = q.
    _close(apply_sampling_convention(LOGITS_V, 0.5), [math.log(q) for q in Q])


def test_top_p_nucleus_by_hand():
    # Ascending q: 0.10, 0.15, 0.25, 0.50; cumulative 0.10, 0.25, 0.50, 1.0.
    # Dropped: cumulative <= 1 - 0.8 = 0.2 -> only 0.10. Kept mass 0.9, renormalised:
    # [0.5, 0.25, 0.15] / 0.9 = [5/9, 5/18, 1/6], and the dropped token is -inf.
    expected = [math.log(5 / 9), math.log(5 / 18), math.log(1 / 6), NEG_INF]
    _close(apply_sampling_convention(LOGITS_V, 0.5, top_p=0.8), expected)


def test_top_p_keeps_a_token_whose_mass_crosses_the_threshold():
    # top_p 0.6: cumulative 0.10, 0.25 <= 0.4 are dropped; 0.50 > 0.4 keeps 0.25 -> {0.5, 0.25}.
    _close(
        apply_sampling_convention(LOGITS_V, 0.5, top_p=0.6),
        [math.log(2 / 3), math.log(1 / 3), NEG_INF, NEG_INF],
    )


def test_top_k_then_top_p_by_hand():
    # top-k 2 keeps {0.5, 0.25} -> [2/3, 1/3]; then top-p 0.6 on that: ascending 1/3, 2/3,
    # cumulative 1/3 <= 0.4 dropped -> only the first token, log-prob 0.
    _close(
        apply_sampling_convention(LOGITS_V, 0.5, top_k=2),
        [math.log(2 / 3), math.log(1 / 3), NEG_INF, NEG_INF],
    )
    _close(apply_sampling_convention(LOGITS_V, 0.5, top_p=0.6, top_k=2), [0.0, NEG_INF, NEG_INF, NEG_INF])


def test_top_k_keeps_ties():
    z = torch.tensor([1.0, 2.0, 2.0, 0.0])
    kept = torch.isfinite(filter_logits(z, top_k=1))
    assert kept.tolist() == [False, True, True, False]


def test_raw_mode_ignores_temperature_and_filters():
    # raw = log_softmax(z) with z = 0.5 log q: p proportional to sqrt(q).
    roots = [math.sqrt(q) for q in Q]
    expected = [math.log(r / sum(roots)) for r in roots]
    _close(apply_sampling_convention(LOGITS_V, 0.5, top_p=0.8, top_k=2, mode="raw_logprobs"), expected)


def test_greedy_is_unfiltered_log_softmax():
    # vLLM does not scale or filter an all-greedy batch; its processed log-probs are log_softmax(z).
    expected = apply_sampling_convention(LOGITS_V, 1.0, mode="raw_logprobs").tolist()
    _close(apply_sampling_convention(LOGITS_V, 0.0, top_p=0.5), expected)


def test_gather_on_batched_logits():
    logits_BTV = LOGITS_V.repeat(2, 3, 1)
    targets_BT = torch.tensor([[0, 1, 2], [3, 2, 0]])
    got = token_logprobs_full_vocab(logits_BTV, targets_BT, 0.5, top_p=0.8)
    lq = [math.log(5 / 9), math.log(5 / 18), math.log(1 / 6), NEG_INF]
    assert got.shape == (2, 3)
    _close(got[0], [lq[0], lq[1], lq[2]])
    _close(got[1], [lq[3], lq[2], lq[0]])


def test_what_the_trainer_must_do():
    assert trainer_temperature("processed_logprobs", 0.7) == 0.7
    assert trainer_temperature("raw_logprobs", 0.7) == 1.0
    assert trainer_temperature("processed_logprobs", 0.0) == 1.0
    assert not needs_full_vocab("processed_logprobs", 1.0, -1)
    assert needs_full_vocab("processed_logprobs", 0.9, -1)
    assert needs_full_vocab("processed_logprobs", 1.0, 20)
    assert not needs_full_vocab("raw_logprobs", 0.9, 20)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="logprobs_mode"):
        apply_sampling_convention(LOGITS_V, 1.0, mode="processed_logits")
    with pytest.raises(ValueError, match="top_p"):
        apply_sampling_convention(LOGITS_V, 1.0, top_p=0.0)
