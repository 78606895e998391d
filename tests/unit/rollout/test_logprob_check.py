"""The log-prob agreement report on samples whose differences are known by construction."""

import math

import pytest
import torch

from megatron_rl.rollout.logprob_check import bind_trainer_logprobs, check_samples, compare
from megatron_rl.rollout.types import Sample, SamplingSettings


def _sample(i, logprobs, version=3, prompt=(1, 2, 3)):
    return Sample(
        i, 0, list(prompt), list(range(10, 10 + len(logprobs))), list(logprobs), "stop", False, version
    )


def test_statistics_by_hand():
    engine = [_sample(0, [-1.0, -2.0]), _sample(1, [-0.5, -0.5, -3.0])]
    # diffs (trainer - engine): [0.1, -0.2] and [0, 0.7, 0]
    trainer = [torch.tensor([-0.9, -2.2]), torch.tensor([-0.5, 0.2, -3.0])]
    r = compare(engine, trainer, threshold=0.5)
    diffs = [0.1, -0.2, 0.0, 0.7, 0.0]
    assert r["version"] == 3 and r["sequences"] == 2 and r["tokens"] == 5
    assert r["mean_abs_diff"] == pytest.approx(sum(abs(d) for d in diffs) / 5)
    assert r["max_abs_diff"] == pytest.approx(0.7)
    ratios = sorted(math.exp(d) for d in diffs)
    assert r["ratio_mean"] == pytest.approx(sum(ratios) / 5)
    assert r["ratio_max"] == pytest.approx(math.exp(0.7))
    assert r["ratio_min"] == pytest.approx(math.exp(-0.2))
    # torch.quantile interpolates linearly: p99 lies 0.96 of the way from the 4th to the 5th ratio.
    assert r["ratio_p99"] == pytest.approx(ratios[3] + 0.96 * (ratios[4] - ratios[3]))
    assert r["beyond_threshold"] == [1]
    assert r["nonfinite_tokens"] == 0


def test_a_token_outside_the_trainer_support_is_flagged_not_averaged():
    engine = [_sample(0, [-1.0, -1.0]), _sample(1, [-1.0])]
    trainer = [torch.tensor([-1.0, float("-inf")]), torch.tensor([-1.0])]
    r = compare(engine, trainer, threshold=0.5)
    assert r["nonfinite_tokens"] == 1
    assert r["max_abs_diff"] == 0.0
    assert r["beyond_threshold"] == [0]


def test_misaligned_input_is_refused():
    with pytest.raises(ValueError, match="sequence 0: trainer gave 3 log-probs for 2 engine tokens"):
        compare([_sample(0, [-1.0, -1.0])], [torch.zeros(3)], 0.5)


def test_mixed_versions_compare_only_the_newest_versions_tokens():
    # A continued sample (partial rollouts): its first two tokens from version 1, the last from 2; and a
    # whole sample of version 1. Against a trainer at version 2, only the version-2 token is compared.
    cont = _sample(0, [-1.0, -1.0, -2.0], version=1)
    cont.token_versions = [1, 1, 2]
    old = _sample(1, [-1.0], version=1)
    r = compare([cont, old], [torch.tensor([-9.0, -9.0, -2.25]), torch.tensor([-9.0])], threshold=0.5)
    assert r["version"] == 2 and r["tokens"] == 1 and r["older_version_tokens"] == 3
    assert r["max_abs_diff"] == pytest.approx(0.25) and r["beyond_threshold"] == []
    # Wrongly tagged (every token version 2), the version-1 drift would count and cross the threshold.
    cont.token_versions = None
    cont.version = 2
    assert compare([cont], [torch.tensor([-9.0, -9.0, -2.25])], 0.5)["beyond_threshold"] == [0]


def _bigram_logprobs(sequences, prompt_lens, temperature=1.0):
    """A real (tiny) language model: log p(next | prev) from a fixed bigram table, teacher-forced."""
    g = torch.Generator().manual_seed(0)
    table = torch.log_softmax(torch.randn(32, 32, generator=g) / temperature, -1)
    return [table[torch.tensor(s[p - 1 : -1]), torch.tensor(s[p:])] for s, p in zip(sequences, prompt_lens)]


def test_check_samples_aligns_completion_positions():
    # "Engine" samples scored by the same bigram model agree exactly; a one-position shift does not.
    prompts, completions = [[1, 2, 3], [4, 5]], [[7, 8, 9, 10], [11]]
    lps = _bigram_logprobs([p + c for p, c in zip(prompts, completions)], [3, 2], temperature=0.7)
    samples = [
        Sample(i, 0, p, c, lp.tolist(), "length", True, 0)
        for i, (p, c, lp) in enumerate(zip(prompts, completions, lps))
    ]
    fn = bind_trainer_logprobs(_bigram_logprobs, "processed_logprobs", SamplingSettings(temperature=0.7))
    r = check_samples(samples, fn, threshold=1e-6)
    assert r["max_abs_diff"] < 1e-6 and r["beyond_threshold"] == []

    def shifted(sequences, prompt_lens, temperature=1.0):
        return [torch.cat([x[1:], x[:1]]) for x in _bigram_logprobs(sequences, prompt_lens, temperature)]

    fn_bad = bind_trainer_logprobs(shifted, "processed_logprobs", SamplingSettings(temperature=0.7))
    assert check_samples(samples, fn_bad, threshold=1e-3)["beyond_threshold"] == [0]


def test_binding_follows_the_mode_and_refuses_truncated_support():
    seen = {}

    def record(sequences, prompt_lens, temperature=1.0):
        seen["T"] = temperature
        return [torch.zeros(len(s) - p) for s, p in zip(sequences, prompt_lens)]

    bind_trainer_logprobs(record, "raw_logprobs", SamplingSettings(temperature=0.7))([[1, 2]], [1])
    assert seen["T"] == 1.0
    bind_trainer_logprobs(record, "processed_logprobs", SamplingSettings(temperature=0.7))([[1, 2]], [1])
    assert seen["T"] == 0.7
    with pytest.raises(ValueError, match="top_p=0.9"):
        bind_trainer_logprobs(record, "processed_logprobs", SamplingSettings(top_p=0.9))


def test_a_share_of_carried_samples_alone_compares_nothing_against_the_batchs_version():
    """A DP rank or minibatch may hold only samples carried from version 1 while the batch's newest
    (the trainer's) is 2: measured against version 2 they give no tokens, not a false alarm."""
    old = _sample(0, [-1.0, -1.0], version=1)
    r = compare([old], [torch.tensor([-5.0, -5.0])], threshold=0.5, version=2)
    assert r["tokens"] == 0 and r["older_version_tokens"] == 2 and r["beyond_threshold"] == []
    assert math.isnan(r["max_abs_diff"])
    # without the batch's version the share's own newest (1) is compared, drift and all
    assert compare([old], [torch.tensor([-5.0, -5.0])], threshold=0.5)["beyond_threshold"] == [0]
