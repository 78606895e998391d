import pytest

from megatron_rl.reward.result import RewardResult, reward_from_counts


@pytest.mark.parametrize(
    ("status", "passed", "total", "mode", "expected"),
    [
        ("passed", 4, 4, "all_or_nothing", 1.0),
        ("failed", 3, 4, "all_or_nothing", 0.0),
        ("failed", 3, 4, "fraction", 0.75),
        ("timeout", 1, 4, "fraction", 0.25),
        ("timeout", 4, 4, "all_or_nothing", 0.0),
        ("syntax_error", 0, 4, "fraction", 0.0),
        ("sandbox_error", 4, 4, "fraction", 0.0),
        ("passed", 0, 0, "all_or_nothing", 0.0),
    ],
)
def test_reward_from_counts(status, passed, total, mode, expected):
    assert reward_from_counts(status, passed, total, mode) == expected


def test_unknown_mode_and_status_are_rejected():
    with pytest.raises(ValueError, match="fraction"):
        reward_from_counts("passed", 1, 1, "partial")
    with pytest.raises(ValueError, match="status"):
        RewardResult(0, 0.0, "ok")
