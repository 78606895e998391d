"""A run whose rewards carry no signal says so once, naming the likely cause (loop/record/signal.py)."""

from __future__ import annotations

from megatron_rl.loop.record.signal import SignalWatch, flat, longest_flat_stretch, no_signal_line


def _rec(step: int, statuses: dict, flat_share: float = 1.0, top: float = 0.0, capped: float = 0.0) -> dict:
    return {
        "step": step,
        "reward": {"mean": top / 2, "max": top, "statuses": statuses, "flat_group_fraction": flat_share},
        "tokens": {"truncated_fraction": capped},
    }


def test_the_issues_run_every_sample_no_code_names_the_missing_code_block():
    """Issue 36: every step `statuses: {"no_code": 16}`, loss and grad norm 0."""
    watch = SignalWatch(3, "outputs/mine/samples.jsonl")
    said = [watch.see(_rec(s, {"no_code": 16}, capped=1.0)) for s in (1, 2, 3, 4, 5)]
    assert said[:2] == [None, None] and said[3:] == [None, None], "said once, at the third flat step"
    assert said[2] == (
        "no learning signal for 3 steps in a row (steps 1-3): every reward was 0, so every advantage is 0 "
        "and the policy learns nothing; likely cause: 100% no_code: the completions hold no code block (ask "
        "for one with data.system_prompt, or start from a model that writes code); every completion ran to "
        "the rollout.max_new_tokens cap (read a few in outputs/mine/samples.jsonl)"
    )


def test_each_dominant_status_has_its_own_cause():
    for status, words in {
        "timeout": "time limit (reward.timeout_s)",
        "passed": "too easy",
        "failed": "too hard",
        "syntax_error": "does not compile",
        "sandbox_error": "the sandbox itself fails",
    }.items():
        top = 1.0 if status == "passed" else 0.0
        line = no_signal_line(
            [_rec(1, {status: 15, "failed" if status != "failed" else "crashed": 1}, top=top)]
        )
        assert f"94% {status}: " in line and words in line, line
        assert "for 1 step in a row (step 1)" in line


def test_mixed_statuses_name_the_most_frequent_or_the_groups_too_alike():
    zero = no_signal_line([_rec(1, {"no_code": 10, "syntax_error": 6})])
    assert (
        "likely cause: 62% no_code, 38% syntax_error; most often no_code: the completions hold no code"
        in zero
    )
    # Rewards to earn, yet every prompt's samples score alike: the groups give nothing to compare.
    alike = no_signal_line([_rec(1, {"passed": 8, "failed": 8}, top=1.0)])
    assert "the samples of each prompt all got one reward" in alike
    assert "50% failed, 50% passed, but the samples of each prompt score alike" in alike
    assert "rollout.samples_per_prompt" in alike and "rollout.temperature" in alike


def test_a_step_with_signal_restarts_the_count_and_0_never_says():
    watch = SignalWatch(2)
    steps = [_rec(1, {"failed": 4}), _rec(2, {"failed": 3, "passed": 1}, 0.5, 1.0), _rec(3, {"failed": 4})]
    assert [watch.see(r) for r in steps] == [None, None, None]
    assert watch.see(_rec(4, {"failed": 4})).startswith("no learning signal for 2 steps in a row (steps 3-4)")
    off = SignalWatch(0)
    assert all(off.see(_rec(s, {"no_code": 4})) is None for s in range(1, 10))
    assert not flat({"step": 1, "reward": {"mean": 0.0}}), "an older record, without the figure, is not flat"


def test_the_report_names_the_longest_stretch():
    recs = [_rec(1, {"no_code": 4}), _rec(2, {"passed": 2, "failed": 2}, 0.5, 1.0)]
    recs += [_rec(s, {"failed": 4}) for s in range(3, 7)]
    got = longest_flat_stretch(recs, 3)
    assert got["steps"] == [3, 6] and got["line"].startswith(
        "no learning signal for 4 steps in a row (steps 3-6)"
    )
    assert longest_flat_stretch(recs, 5) is None and longest_flat_stretch(recs, 0) is None
    # A gap in the records (steps 3 and 5 without 4) is not a stretch.
    assert longest_flat_stretch([_rec(3, {"failed": 4}), _rec(5, {"failed": 4})], 2) is None
