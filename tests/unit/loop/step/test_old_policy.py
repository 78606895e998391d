"""Where the old log-probs come from (algorithm.old_logprobs), and the loss that uses the update's own
forward for them: the same gradient as a recomputed pass, and refused when the driver mixes them up."""

import types

import pytest
import torch

from megatron_rl.algorithms import old_policy as op
from megatron_rl.loop.step.rl_batch import grpo_loss_fn
from megatron_rl.trainer.batch import make_microbatches


def test_auto_skips_the_forward_only_when_the_update_computes_the_same_values():
    assert op.source("auto", 1, False, 0.04) == op.UPDATE
    assert op.source("auto", 2, False, 0.04) == op.RECOMPUTE  # later minibatches follow an update
    assert op.source("auto", 1, True, 0.04) == op.RECOMPUTE  # KL in the reward, before the update
    assert op.source("auto", 1, True, 0.0) == op.UPDATE  # ... unless there is no KL at all
    assert op.source("recompute", 1, False, 0.0) == op.RECOMPUTE
    assert op.source("engine", 4, True, 0.04) == op.ENGINE
    assert op.needs_forward("auto", 1, False, 0.0) is False and op.needs_forward("auto", 4, False, 0.0)
    with pytest.raises(ValueError, match="algorithm.old_logprobs='fast'"):
        op.source("fast", 1, False, 0.0)


ALGO = types.SimpleNamespace(
    loss_agg="token-mean", kl_in_reward=False, kl_coef=0.04, clip_low=0.2, clip_high=0.28,
    kl_estimator="k3", truncated_is_cap=2.0,
)  # fmt: skip


def _microbatch(with_old: bool, old_values=None):
    seqs, plens = [[1, 2, 3, 4, 5], [6, 7, 8]], [2, 1]
    g = torch.Generator().manual_seed(0)
    extras = {
        "adv": [torch.full((3,), 0.8), torch.full((2,), -0.6)],
        "keep": [torch.ones(3), torch.ones(2)],
        "rollout": [torch.randn(3, generator=g) - 2, torch.randn(2, generator=g) - 2],
        "ref": [torch.randn(3, generator=g) - 2, torch.randn(2, generator=g) - 2],
    }
    if with_old:
        extras["old"] = old_values
    (mb,) = make_microbatches(seqs, plens, 2, extras=extras)
    return mb


def _grad(mb, lp0, old_from_forward):
    lp = lp0.clone().requires_grad_()
    loss, metrics = grpo_loss_fn(ALGO, 8, 5.0, old_from_forward=old_from_forward)(lp, mb)
    loss.backward()
    return loss.detach(), lp.grad, metrics


def test_the_update_forward_gives_the_gradient_a_recomputed_pass_gives():
    lp0 = torch.randn(2, 7, generator=torch.Generator().manual_seed(1)) - 2
    mb_forward = _microbatch(with_old=False)
    # A recompute on the same weights returns these very values: old = current, ratio 1.
    per_seq = [lp0[0, 1:4].clone(), lp0[1, 0:2].clone()]
    mb_recompute = _microbatch(with_old=True, old_values=per_seq)
    loss_a, grad_a, m_a = _grad(mb_forward, lp0, True)
    loss_b, grad_b, m_b = _grad(mb_recompute, lp0, False)
    assert torch.allclose(loss_a, loss_b, atol=1e-7) and torch.allclose(grad_a, grad_b, atol=1e-7)
    assert float(m_a["ratio_mean"]) == pytest.approx(1.0) and float(m_a["clip_fraction"]) == 0.0
    # And it is not a loss that ignores the old log-probs: a different old pass changes the gradient.
    mb_stale = _microbatch(with_old=True, old_values=[t - 0.3 for t in per_seq])
    _, grad_c, _ = _grad(mb_stale, lp0, False)
    assert not torch.allclose(grad_a, grad_c, atol=1e-4)


def test_the_loss_refuses_old_logprobs_it_was_not_told_about():
    lp = torch.zeros(2, 7, requires_grad=True)
    with pytest.raises(ValueError, match="old log-probs given for an on-policy update"):
        grpo_loss_fn(ALGO, 8, 5.0, old_from_forward=True)(
            lp, _microbatch(True, [torch.zeros(3), torch.zeros(2)])
        )
    with pytest.raises(ValueError, match="no old log-probs given"):
        grpo_loss_fn(ALGO, 8, 5.0)(lp, _microbatch(False))
