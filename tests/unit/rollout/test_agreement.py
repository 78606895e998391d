"""Thresholds set by precision, and a verdict that fails closed (rollout/agreement.py)."""

from __future__ import annotations

import math

import pytest

from megatron_rl.config.load import load_recipe
from megatron_rl.rollout.agreement import FLOORS, dtypes_of, problems, thresholds_for, thresholds_of, worst


def _stats(max_gap, mean_gap, tokens=64, nonfinite=0):
    return dict(max_abs_diff=max_gap, mean_abs_diff=mean_gap, tokens=tokens, nonfinite_tokens=nonfinite)


def test_each_pair_is_its_floor_times_its_margin():
    for (t, e), floor in FLOORS.items():
        th = thresholds_for(t, e)
        assert th.max_gap == pytest.approx(floor.max_gap * floor.margin)
        assert th.mean_gap == pytest.approx(floor.mean_gap * floor.margin)
        assert th.source == "precision" and (th.trainer_dtype, th.engine_dtype) == (t, e)
    # bf16 rounding is orders of magnitude above fp32's: one flat number cannot serve both
    assert thresholds_for("fp32", "bf16").mean_gap > 1000 * thresholds_for("fp32", "fp32").mean_gap
    assert thresholds_for("float32", "bfloat16") == thresholds_for("fp32", "bf16")  # either spelling


def test_a_recipe_sets_its_own_thresholds_and_a_pair_without_a_floor_needs_both():
    th = thresholds_for("fp32", "fp32", mean_gap=1e-3)
    assert th.mean_gap == 1e-3 and th.max_gap == thresholds_for("fp32", "fp32").max_gap
    assert th.source == "precision (max) / recipe (mean)"
    with pytest.raises(
        KeyError, match="no clean agreement was measured for a fp16 trainer and a fp16 engine"
    ):
        thresholds_for("fp16", "fp16", max_gap=0.1)
    assert thresholds_for("fp16", "fp16", 0.1, 0.01).source == "recipe"
    with pytest.raises(ValueError, match="rollout.dtype"):
        thresholds_for("fp32", "fp8")


def test_the_engines_dtype_is_the_trainers_unless_the_recipe_says_otherwise():
    assert dtypes_of(load_recipe("grpo_tiny_cpu")) == ("fp32", "fp32")
    assert dtypes_of(load_recipe("grpo_tiny_cpu", ["rollout.dtype=bf16"])) == ("fp32", "bf16")
    assert thresholds_of(load_recipe("grpo_tiny_cpu", ["rollout.logprob_max_gap=0.2"])).max_gap == 0.2


def test_the_verdict_passes_agreement_and_fails_closed_on_what_it_cannot_prove():
    th = thresholds_for("fp32", "fp32")
    assert problems(_stats(th.max_gap, th.mean_gap), th) == []  # at the threshold: agreed
    assert len(problems(_stats(2 * th.max_gap, 2 * th.mean_gap), th)) == 2
    assert problems(_stats(2 * th.max_gap, 0.0), th)[0].startswith("max |trainer - engine|")
    assert problems(_stats(0.0, 2 * th.mean_gap), th)[0].startswith("mean |trainer - engine|")
    assert "no token was compared" in problems(_stats(math.nan, math.nan, tokens=0), th)[0]
    assert any("non-finite" in p for p in problems(_stats(0.0, 0.0, nonfinite=1), th))
    nan = problems(_stats(math.nan, 0.0), th)
    assert nan and "nan" in nan[0]  # a NaN figure is never "under the threshold"
    assert problems(_stats(10.0, 0.0), th, judge_max=False) == []  # the mean alone (a bf16 step)


def test_worst_takes_every_engines_largest_figures():
    w = worst({0: _stats(1e-6, 1e-7, 10), 1: _stats(5e-3, 1e-8, 20, 1), 2: _stats(math.nan, 2e-7, 0)})
    assert math.isnan(w["max_abs_diff"]) and w["mean_abs_diff"] == 2e-7
    assert w["tokens"] == 30 and w["nonfinite_tokens"] == 1


def test_an_inplace_swap_keeps_what_served_before():
    """rollout/engine_weights.py `swap_into`: the live tensor takes the staged values and the staging buffer
    keeps the previous ones (a refused probe restores them), across dtypes as a bf16 engine needs."""
    import torch

    from megatron_rl.rollout.engine_weights import swap_into

    live = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    staged = torch.full((2, 3), 7.5, dtype=torch.float32)
    before = live.clone()
    swap_into(live, staged)
    assert torch.equal(live, torch.full((2, 3), 7.5, dtype=torch.bfloat16))
    assert torch.equal(staged, before.float())
