"""The asynchronous batch's loss, by hand: a sample drawn by an older engine version is weighted by
min(pi_old / pi_engine, cap) with pi_engine its *own* sampling log-probs (Sample.logprobs, carried as
"rollout"), and the clipped ratio is against the trainer's old log-probs -- the driver's real path
(minibatch_extras -> grpo_loss_fn), checked token by token against numbers worked out here."""

import math
import types

import pytest
import torch

from megatron_rl.loop.step.rl_batch import grpo_loss_fn, minibatch_extras
from megatron_rl.rollout.types import Sample
from megatron_rl.trainer.batch import make_microbatches

CAP = 2.0
ALGO = types.SimpleNamespace(
    loss_agg="token-mean", kl_in_reward=False, kl_coef=0.0, clip_low=0.2, clip_high=0.28,
    kl_estimator="k3", truncated_is_cap=CAP,
)  # fmt: skip


def _sample(i, prompt, tokens, engine_lp, version):
    return Sample(i, 0, prompt, tokens, engine_lp, "stop", False, version)


def test_stale_samples_are_weighted_against_their_own_engine_logprobs():
    # Two samples from engine version 3, trained at version 4 (lag 1). Engine log-probs (behaviour):
    behaviour = [[-1.0, -2.0, -0.5], [-3.0, -0.2]]
    samples = [_sample(0, [5, 6], [7, 8, 9], behaviour[0], 3), _sample(1, [5], [4, 3], behaviour[1], 3)]
    # The trainer's old log-probs (its current policy, before this update) -- different from the engine's.
    old = {0: torch.tensor([-0.5, -2.5, -0.5]), 1: torch.tensor([-1.0, -0.3])}
    adv = torch.tensor([1.0, -1.0])
    extras = minibatch_extras(samples, [0, 1], adv, [1.0, 1.0], old, {})
    for got, want in zip(extras["rollout"], behaviour):  # the engine's own, not the trainer's
        assert got.tolist() == pytest.approx(want)
    (mb,) = make_microbatches(
        [s.sequence for s in samples], [s.prompt_len for s in samples], 2, extras=extras
    )
    # The update's forward: the new policy, a little away from old.
    new = {0: [-0.4, -2.0, -0.6], 1: [-1.2, -0.3]}
    lp_BT = torch.full(mb.loss_mask_BT.shape, -9.0)
    for b, i in enumerate([0, 1]):
        start = samples[i].prompt_len - 1
        lp_BT[b, start : start + len(new[i])] = torch.tensor(new[i])
    loss, metrics = grpo_loss_fn(ALGO, 8, 5.0)(lp_BT, mb)

    expected, weights = 0.0, []
    for i in (0, 1):
        a = adv[i].item()
        for t, lp in enumerate(new[i]):
            o, behav = old[i][t].item(), behaviour[i][t]
            w = min(math.exp(o - behav), CAP)  # truncated IS against the behaviour policy
            r = math.exp(lp - o)  # the PPO ratio against the trainer's old policy
            clipped = min(max(r, 1 - ALGO.clip_low), 1 + ALGO.clip_high)
            expected += -min(r * a, clipped * a) * w
            weights.append(w)
    assert loss.item() == pytest.approx(expected / 5.0, rel=1e-5)
    assert metrics["is_weight_mean"].item() == pytest.approx(sum(weights) / len(weights), rel=1e-5)
    assert max(weights) == CAP  # the cap binds on one token here (exp(1.5) and exp(2.0) > 2)


def test_the_wrong_behaviour_logprobs_give_another_loss():
    """A driver that passed the trainer's old log-probs as the behaviour policy would weight every token
    by 1: the loss differs, so the test above can tell the two apart."""
    behaviour = [-1.0, -2.0, -0.5]
    sample = _sample(0, [5, 6], [7, 8, 9], behaviour, 3)
    old = {0: torch.tensor([-0.5, -2.5, -0.5])}
    right = minibatch_extras([sample], [0], torch.tensor([1.0]), [1.0], old, {})
    wrong = dict(right, rollout=[old[0].clone()])
    losses = []
    for extras in (right, wrong):
        (mb,) = make_microbatches([sample.sequence], [sample.prompt_len], 1, extras=extras)
        lp = torch.full(mb.loss_mask_BT.shape, -9.0)
        lp[0, 1:4] = torch.tensor([-0.4, -2.0, -0.6])
        losses.append(grpo_loss_fn(ALGO, 8, 3.0)(lp, mb)[0].item())
    assert losses[0] != pytest.approx(losses[1], rel=1e-3)
