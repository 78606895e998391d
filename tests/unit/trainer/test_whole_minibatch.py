"""The rules that turn microbatch metrics into a minibatch's (trainer/policy.py `_combine`), as
`Policy.train_step` applies them to every DP share's microbatches at once: the step record's loss is the
whole minibatch's whatever rank writes it. The collective itself runs in tests/dist/trainer (DP2, PP2)."""

import pytest

from megatron_rl.trainer.policy import _combine


def test_losses_add_up_and_means_weigh_by_tokens_over_every_share():
    share_a = [
        {"loss": 0.10, "pg_loss": 0.10, "tokens": 3.0, "kl": 1.0, "ratio_max": 1.1},
        {"loss": 0.05, "pg_loss": 0.04, "tokens": 1.0, "kl": 2.0, "ratio_max": 1.0},
    ]
    share_b = [{"loss": 0.20, "pg_loss": 0.20, "tokens": 4.0, "kl": 3.0, "ratio_max": 1.3}]
    whole = _combine(share_a + share_b)
    assert whole["loss"] == pytest.approx(0.35)  # each part normalised by the global count: their sum
    assert whole["pg_loss"] == pytest.approx(0.34)
    assert whole["tokens"] == 8.0
    assert whole["kl"] == pytest.approx((3 * 1.0 + 1 * 2.0 + 4 * 3.0) / 8)
    assert whole["ratio_max"] == 1.3
    # one share alone is what a rank held before the gather: a part, not the minibatch
    assert _combine(share_b)["loss"] == pytest.approx(0.20)


def test_a_critics_value_loss_adds_up_and_its_clip_fraction_is_a_token_mean():
    parts = [
        {"loss": 0.3, "value_loss": 0.3, "value_clip_fraction": 0.0, "tokens": 2.0},
        {"loss": 0.1, "value_loss": 0.1, "value_clip_fraction": 1.0, "tokens": 6.0},
    ]
    whole = _combine(parts)
    assert whole["value_loss"] == pytest.approx(0.4) and whole["loss"] == pytest.approx(0.4)
    assert whole["value_clip_fraction"] == pytest.approx(0.75)


def test_without_tokens_a_mean_is_plain_and_a_key_not_everywhere_is_dropped():
    whole = _combine([{"loss": 1.0, "x": 1.0, "y": 5.0}, {"loss": 2.0, "x": 3.0}])
    assert whole == {"loss": 3.0, "x": 2.0}
    assert _combine([]) == {}  # a stage before the last, alone: nothing to report
