"""The step's batch bookkeeping: DP/minibatch assignment, global normalisers, KL folded into rewards."""

import torch

from megatron_rl.config.schema import AlgorithmConfig
from megatron_rl.loop.step.rl_batch import (
    advantages_with_kl,
    assign,
    global_normaliser,
    loss_mask_keep,
    minibatch_extras,
    shaped_rewards,
)
from megatron_rl.rollout.types import Sample


def _sample(p, s, n_tokens, reward, truncated=False, finish_reason=None):
    finish_reason = finish_reason or ("length" if truncated else "stop")
    tokens = list(range(3, 3 + n_tokens))
    return Sample(p, s, [1, 2], tokens, [-0.5] * n_tokens, finish_reason, truncated, 1, reward, "failed")


def test_assign_partitions_every_sample_once_and_is_seeded():
    plan = assign(16, dp=2, minibatches=4, seed=3, step=7)
    flat = sorted(i for mb in plan for share in mb for i in share)
    assert flat == list(range(16))
    assert all(len(share) == 2 for mb in plan for share in mb)
    assert plan == assign(16, 2, 4, 3, 7) and plan != assign(16, 2, 4, 3, 8)


def test_global_normaliser_counts_tokens_or_sequences_of_the_whole_minibatch():
    samples = [_sample(0, 0, 3, 1.0), _sample(0, 1, 5, 0.0), _sample(1, 0, 2, 0.0, truncated=True)]
    keep = [1.0, 1.0, 1.0]
    assert global_normaliser(samples, [0, 1, 2], keep, "token-mean") == 10.0
    assert global_normaliser(samples, [0, 1, 2], keep, "seq-mean-token-mean") == 3.0
    algo = AlgorithmConfig(overlong="mask")
    keep = loss_mask_keep(samples, algo)
    assert keep == [1.0, 1.0, 0.0]
    assert global_normaliser(samples, [0, 1, 2], keep, "token-mean") == 8.0


def test_kl_in_reward_lowers_the_advantage_of_the_sample_that_drifted():
    samples = [_sample(0, 0, 2, 1.0), _sample(0, 1, 2, 1.0)]
    algo = AlgorithmConfig(kl_coef=0.5, kl_in_reward=True)
    plain = advantages_with_kl(samples, 2, algo, 8, None)
    assert torch.equal(plain, torch.zeros(2))  # equal rewards: no signal
    adv = advantages_with_kl(samples, 2, algo, 8, {0: 0.0, 1: 2.0})
    assert adv[0] > 0 > adv[1]  # rewards 1.0 and 1.0 - 0.5 * 2.0 = 0.0


def test_minibatch_extras_are_per_completion_token():
    samples = [_sample(0, 0, 3, 1.0), _sample(0, 1, 1, 0.0)]
    old = {0: torch.zeros(3), 1: torch.zeros(1)}
    x = minibatch_extras(samples, [0, 1], torch.tensor([0.7, -0.7]), [1.0, 1.0], old, {})
    assert [t.numel() for t in x["adv"]] == [3, 1] and abs(float(x["adv"][1][0]) + 0.7) < 1e-6
    assert "ref" not in x and [t.numel() for t in x["rollout"]] == [3, 1]


def _at_the_cap():
    # lengths 2, 4, 4 (cap 4): the second was cut at the cap, the third ended with a stop token there.
    return [
        _sample(0, 0, 2, 1.0),
        _sample(0, 1, 4, 1.0, truncated=True),
        _sample(1, 0, 4, 0.0, finish_reason="stop"),
    ]


def test_overlong_modes_act_on_the_truncated_flag_and_the_length():
    samples = _at_the_cap()
    rewards = [1.0, 1.0, 0.0]
    none = AlgorithmConfig(overlong="none")
    assert shaped_rewards(samples, none, 4).tolist() == rewards
    assert loss_mask_keep(samples, none) == [1.0, 1.0, 1.0]
    # mask: only the sample cut at the cap leaves the loss, not the one that merely ended there.
    mask = AlgorithmConfig(overlong="mask")
    assert shaped_rewards(samples, mask, 4).tolist() == rewards
    assert loss_mask_keep(samples, mask) == [1.0, 0.0, 1.0]
    # penalty: cap 4, ramp over the last 2 tokens: length 2 -> 0, length 4 -> -1, truncated or not.
    penalty = AlgorithmConfig(overlong="penalty", overlong_penalty_tokens=2)
    assert shaped_rewards(samples, penalty, 4).tolist() == [1.0, 0.0, -1.0]
    assert loss_mask_keep(samples, penalty) == [1.0, 1.0, 1.0]
