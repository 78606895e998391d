"""Sample and SamplingSettings refuse what the loop could not use."""

import pytest

from megatron_rl.config.schema import RolloutConfig
from megatron_rl.rollout.types import Sample, SamplingSettings


def test_settings_from_config_and_normalised():
    cfg = RolloutConfig(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=32, stop_token_ids=[5, 6])
    s = SamplingSettings.from_config(cfg)
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.stop_token_ids) == (0.7, 0.9, -1, 32, (5, 6))
    assert s.filters_support
    assert not SamplingSettings().filters_support


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingSettings(**kw)


def test_sample_checks_and_sequence():
    s = Sample(0, 1, [1, 2], [3, 4, 5], [-1.0, -2.0, -3.0], "length", True, 7)
    assert s.sequence == [1, 2, 3, 4, 5] and s.prompt_len == 2
    with pytest.raises(ValueError, match="2 log-probs for 3 tokens"):
        Sample(0, 1, [1], [3, 4, 5], [-1.0, -2.0], "stop", False, 0)
    with pytest.raises(ValueError, match="finish_reason"):
        Sample(0, 1, [1], [3], [-1.0], "abort", False, 0)
