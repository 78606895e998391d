"""The LR schedule: megatron-core's OptimizerParamScheduler as the trainer builds and steps it.

The expected values are written out from the schedule's definition (linear warm-up from 0, then
constant or cosine to min_lr), independently of megatron-core's `OptimizerParamScheduler.get_lr`,
which they check. The scheduler drives a real torch AdamW here: it only sets `param_groups`.
"""

import math
from pathlib import Path

import pytest
import torch

from megatron_rl.checkpoint.resume import load_schedule
from megatron_rl.config.load import load_recipe
from megatron_rl.trainer.build import optim_settings
from megatron_rl.trainer.policy import OptimSettings, lr_scheduler

LR, MIN_LR = 1e-3, 1e-4


def _scheduler(**kw):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=LR)
    return lr_scheduler(opt, OptimSettings(lr=LR, min_lr=MIN_LR, **kw)), opt


def _lrs(sched, opt, n: int) -> list[float]:
    """The LR of optimizer steps 1..n, stepping the scheduler as `Policy.train_step` does (before)."""
    out = []
    for _ in range(n):
        sched.step(1)
        out.append(opt.param_groups[0]["lr"])
    return out


def test_warmup_ramps_linearly_from_zero_then_stays_constant():
    sched, opt = _scheduler(warmup_steps=4)
    assert _lrs(sched, opt, 8) == pytest.approx([LR * k / 4 for k in (1, 2, 3, 4)] + [LR] * 4)


def test_no_warmup_is_constant_from_the_first_step():
    sched, opt = _scheduler()
    assert _lrs(sched, opt, 5) == pytest.approx([LR] * 5)


def test_cosine_decays_from_lr_to_min_lr_at_the_last_step():
    warm, total = 2, 10
    sched, opt = _scheduler(warmup_steps=warm, lr_schedule="cosine", decay_steps=total)
    cosine = [
        MIN_LR + 0.5 * (1 + math.cos(math.pi * (k - warm) / (total - warm))) * (LR - MIN_LR)
        for k in range(warm + 1, total + 1)
    ]
    got = _lrs(sched, opt, total)
    assert got == pytest.approx([LR / 2, LR, *cosine])
    assert got[-1] == pytest.approx(MIN_LR)


def test_a_cosine_without_steps_after_warmup_is_refused():
    with pytest.raises(ValueError, match="warm-up"):
        OptimSettings(lr_schedule="cosine", warmup_steps=8, decay_steps=8)


def test_the_recipe_counts_rl_steps_the_scheduler_optimizer_steps():
    recipe = load_recipe("grpo_tiny_cpu", ["optim.warmup_steps=3", "optim.lr_schedule=cosine", "steps=7"])
    o = optim_settings(recipe)
    k = recipe.algorithm.minibatches
    assert (o.warmup_steps, o.decay_steps, o.lr_schedule) == (3 * k, 7 * k, "cosine")


def test_a_restored_schedule_continues_the_uninterrupted_one():
    """Resume: the saved count of optimizer steps, loaded into a scheduler that had already stepped
    (the recipe's values win: `override_opt_param_scheduler`), gives the uninterrupted LRs."""
    kw = dict(warmup_steps=3, lr_schedule="cosine", decay_steps=12)
    a, opt_a = _scheduler(**kw)
    first = _lrs(a, opt_a, 5)
    saved = a.state_dict()
    rest = _lrs(a, opt_a, 7)

    b, opt_b = _scheduler(**kw)
    _lrs(b, opt_b, 2)  # a resumed policy may have stepped before the load
    load_schedule(b, saved, Path("step_000005"))
    assert _lrs(b, opt_b, 7) == rest
    assert first[-1] != rest[0]
