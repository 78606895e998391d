"""PPO's step pieces (loop/step/ppo.py) on hand-made samples: the sequence reward on the last generated token,
GAE over the generated tokens only, whitening over the batch, the reward model's weighted sum."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron_rl.config.schema import AlgorithmConfig, RewardConfig
from megatron_rl.loop.step import ppo
from megatron_rl.rollout.types import Sample


def _sample(i: int, n: int, reward: float, loss_mask=None) -> Sample:
    return Sample(
        i, 0, [1, 2], list(range(3, 3 + n)), [-1.0] * n, "stop", False, 1, reward=reward, loss_mask=loss_mask
    )


def _algo(**kw) -> AlgorithmConfig:
    return AlgorithmConfig(**{"name": "ppo", "gamma": 1.0, "lam": 1.0, "advantage_whiten": "none", **kw})


def test_returns_are_the_reward_to_go_and_advantages_subtract_the_values():
    samples = [_sample(0, 3, 1.0), _sample(1, 2, 0.0)]
    values = {0: torch.tensor([0.5, 0.25, 0.75]), 1: torch.tensor([0.1, -0.2])}
    adv, ret, m = ppo.advantages(samples, [0, 1], values, _algo(), max_new_tokens=8)
    # gamma = lam = 1: every token's return is the sequence's reward, its advantage that minus its value
    assert torch.allclose(ret[0], torch.tensor([1.0, 1.0, 1.0])) and torch.allclose(ret[1], torch.zeros(2))
    assert torch.allclose(adv[0], torch.tensor([0.5, 0.75, 0.25]))
    assert torch.allclose(adv[1], torch.tensor([-0.1, 0.2]))
    assert m["returns_mean"] == pytest.approx(3 / 5)
    assert m["values_mean"] == pytest.approx((1.5 + -0.1) / 5)


def test_observation_tokens_are_skipped_and_get_nothing():
    # a multi-turn trajectory: token 1 is the environment's; gamma 0.5 discounts over generated tokens only
    samples = [_sample(0, 3, 1.0, loss_mask=[1, 0, 1])]
    values = {0: torch.tensor([0.0, 9.0, 0.0])}
    adv, ret, _ = ppo.advantages(samples, [0], values, _algo(gamma=0.5), max_new_tokens=8)
    assert torch.allclose(ret[0], torch.tensor([0.5, 0.0, 1.0]))  # r=1 on the last; one step back: 0.5
    assert adv[0][1] == 0.0


def test_kl_in_the_reward_is_taken_off_every_generated_token():
    samples = [_sample(0, 2, 1.0)]
    values = {0: torch.zeros(2)}
    kl = {0: torch.tensor([0.5, 0.25])}
    _, ret, _ = ppo.advantages(samples, [0], values, _algo(kl_coef=0.1), max_new_tokens=8, kl=kl)
    assert torch.allclose(ret[0], torch.tensor([1.0 - 0.05 - 0.025, 1.0 - 0.025]))


def test_batch_whitening_gives_mean_zero_and_unit_std():
    samples = [_sample(i, 2 + i, float(i % 2)) for i in range(4)]
    values = {i: torch.linspace(0, 0.3, 2 + i) for i in range(4)}
    adv, _, m = ppo.advantages(samples, list(range(4)), values, _algo(advantage_whiten="batch"), 8)
    flat = torch.cat([adv[i] for i in range(4)])
    assert flat.mean().abs() < 1e-6 and flat.std(unbiased=False) == pytest.approx(1.0, abs=1e-5)
    assert m["advantage_mean"] != pytest.approx(0.0)  # recorded before whitening


def test_perfect_values_explain_all_the_variance():
    samples = [_sample(0, 2, 1.0), _sample(1, 2, 0.0)]
    exact = {0: torch.ones(2), 1: torch.zeros(2)}
    _, _, m = ppo.advantages(samples, [0, 1], exact, _algo(), 8)
    assert m["explained_variance"] == pytest.approx(1.0)
    # returns 1, 1, 0, 0: variance 1/4; the residual none
    assert m["returns_variance"] == pytest.approx(0.25) and m["residual_variance"] == pytest.approx(0.0)
    _, _, m = ppo.advantages(samples, [0, 1], {0: torch.zeros(2), 1: torch.ones(2)}, _algo(), 8)
    assert m["explained_variance"] < 0  # values anti-correlated with the returns


def test_the_reward_models_score_is_weighed_with_the_verifiers():
    samples = [_sample(0, 2, 1.0), _sample(1, 2, 0.0)]
    ppo.combine_rewards(samples, {0: 0.5, 1: -1.0}, RewardConfig(model_weight=0.2, verifier_weight=2.0))
    assert [s.reward for s in samples] == pytest.approx([2.0 + 0.1, -0.2])
    assert [s.model_score for s in samples] == [0.5, -1.0]
    assert ppo.model_score_metrics(samples) == {"reward_model_mean": pytest.approx(-0.25)}
    alone = [_sample(0, 2, 0.0)]
    ppo.combine_rewards(alone, {0: 0.7}, RewardConfig(kind="model", model_weight=1.0))
    assert alone[0].reward == pytest.approx(0.7)


def test_the_value_loss_fn_reads_the_minibatch_extras():
    mb = SimpleNamespace(
        loss_mask_BT=torch.tensor([[1.0, 1.0]]),
        extras={
            "old_values": torch.zeros(1, 2),
            "returns": torch.ones(1, 2),
            "keep": torch.tensor([[1.0, 0.0]]),
        },
    )
    loss, metrics = ppo.value_loss_fn(_algo(value_clip=0.0), 8, normaliser=1.0)(torch.zeros(1, 2), mb)
    assert loss.item() == pytest.approx(0.5)  # 0.5 (0 - 1)^2 on the one kept token
    outs = [
        {"loss": 1.0, "grad_norm": 2.0, "lr": 1e-3},
        {"loss": 3.0, "grad_norm": 4.0, "lr": 2e-3},
    ]
    assert ppo.critic_metrics(outs) == {
        "value_loss": 2.0, "value_clip_fraction": 0.0, "critic_grad_norm": 3.0, "critic_lr": 2e-3,
    }  # fmt: skip
    outs = [{**o, "value_clip_fraction": f} for o, f in zip(outs, (0.25, 0.75))]
    assert ppo.critic_metrics(outs)["value_clip_fraction"] == 0.5
    assert ppo.critic_metrics([]) == {}


def test_a_rank_without_samples_is_refused():
    with pytest.raises(ValueError, match="no samples on this DP rank"):
        ppo.advantages([], [], {}, _algo(), 8)
