"""The plan agrees with itself, for every shipped recipe: the text and `--json` tell one story.

One test per kind of contradiction issue 36 found: the recipe's layout at one recompute in the header
and another in the comparison below it (the same description at two step times), "train leads" while
the reward pool's wait held most of the step, a 3-step recipe planned as 600 steps, an overlapped option
that is not asynchronous or cannot carve its experts, and counts in the wrong number ("1 nodes").
The picture's agreement with the text: test_plot.py.
"""

from __future__ import annotations

import re

import pytest

from megatron_rl.config.load import load_recipe, shipped_recipes
from megatron_rl.plan.calibrate import calibrate, summarize
from megatron_rl.plan.cycle import cycle
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.plan.render import render
from megatron_rl.plan.report import build_report
from megatron_rl.run import resolve

RECIPES = sorted(shipped_recipes())
# Recipes with their overrides, beyond the shipped ones, whose counts reach 1 where the shipped do not.
VARIANTS = [("grpo_tiny_cpu", ["checkpoint.interval=1"]), ("grpo_qwen2.5-7b_1n8g", ["steps=1"])]
ONE_STEP_MEASURED = [
    {
        "step": 1,
        "phases": {
            name: {"seconds": s}
            for name, s in {"generation": 0.4, "scoring": 0.8, "train_fwd_bwd": 0.1, "publish": 0.05}.items()
        },
    }
]
# A layout as the text describes it (parallel/layout.py `describe`).
LAYOUT = re.compile(
    r"(colocated|separated) [\d+]+ GPUs(?: \((?:sync|async)\))?: trainer TP(\d+) PP(\d+) DP(\d+)"
    r"(?: CP(\d+))?(?: EP(\d+) ETP(\d+))?, \d+ x TP\d+ engines?, recompute \w+"
)
# "1" and a plural noun after it (up to two words between): "1 nodes", "1 x TP2 engines", "1 trainer GPUs".
ONE_AND_PLURAL = re.compile(r"(?<![\w.,+])1 (?:x TP\d+ )?(?:[a-z]+ ){0,2}([A-Za-z]+s)\b")
NOT_NOUNS = {"s", "ms", "vs"}


def _plan(name: str, overrides: list[str] | None = None, measured: list[dict] | None = None):
    recipe = load_recipe(name, overrides or [])
    run = resolve(recipe)
    inp = inputs_from_run(run)
    cal = None
    if measured is not None:
        cal = calibrate(inp, run.layout, cycle(inp, run.layout), summarize(measured))
    return recipe, build_report(inp, run.layout, calibration=cal)


@pytest.fixture(scope="module")
def plans():
    return {name: _plan(name) for name in RECIPES}


def _rows(report) -> list[tuple[str, object]]:
    """Every layout the report names with a step time: its own, the comparison, the overlapped option,
    the search's ranking."""
    out = [("the header", report.layout)] + [("the comparison", row) for row in report.splits]
    if report.overlap is not None:
        out.append(("the overlapped option", report.overlap))
    return out + [("the search", row) for row in report.search.ranked]


def test_the_recipes_layout_has_its_own_row_in_the_comparison_at_the_stated_step(plans):
    for name, (_, r) in plans.items():
        own = r.layout.describe
        text = render(r)
        assert f"Layout   {own}" in text, name
        rows = [row for row in r.splits if row.describe == own]
        assert rows, f"{name}: no row of the comparison is the recipe's layout ({own})"
        assert rows[0].recompute == r.layout.recompute and rows[0].step_s == pytest.approx(r.seconds.step), (
            name
        )
        serial = re.search(r"serial cycle +([\d.,]+) s", text).group(1)
        printed = re.search(re.escape(own) + r" +([\d.,]+) ", text[text.index("colocated vs separated") :])
        assert printed and printed.group(1) == serial, f"{name}: {own} at {printed} vs serial cycle {serial}"


def test_a_layout_named_twice_has_one_step_time(plans):
    for name, (_, r) in plans.items():
        seen: dict[str, tuple[str, float]] = {}
        for where, row in _rows(r):
            if row.describe in seen:
                first, step = seen[row.describe]
                assert row.step_s == pytest.approx(step), (
                    f"{name}: {row.describe} takes {step:.3f} s in {first} and {row.step_s:.3f} s in {where}"
                )
            seen.setdefault(row.describe, (where, row.step_s))


def test_every_layout_the_text_offers_can_carve_its_experts(plans):
    for name, (_, r) in plans.items():
        text = render(r)
        offered = text[: text.index("rejected:")] if "rejected:" in text else text
        for m in LAYOUT.finditer(offered):
            tp, pp, dp, cp, ep, etp = (int(x) if x else 1 for x in m.groups()[1:])
            assert (tp * cp * dp) % (ep * etp) == 0, f"{name}: {m.group(0)}: EP x ETP over TP x CP x DP ranks"


def test_the_overlapped_option_is_separated_and_asynchronous(plans):
    for name, (_, r) in plans.items():
        ov = r.overlap
        if ov is None:
            continue
        assert (ov.placement, ov.synchrony) == ("separated", "async") and "(async)" in ov.describe, name
        assert ov.step_s == pytest.approx(ov.overlapped_s) == pytest.approx(r.seconds.overlapped_cycle), name


def test_the_phase_said_to_lead_in_wall_time_is_the_longest(plans):
    for name, (_, r) in plans.items():
        ph = r.phases_s
        wall = {
            "generation": ph.get("generation", 0.0),
            "scoring": ph.get("scoring", 0.0),
            "train": ph.get("train_fwd_bwd", 0.0) + ph.get("optimizer", 0.0),
            "logprob_forwards": ph.get("old_logprobs", 0.0) + ph.get("ref_logprobs", 0.0),
        }
        longest = max(wall, key=wall.__getitem__)
        assert r.dominant.wall == longest, (
            f"{name}: says {r.dominant.wall} leads, {longest} is longest: {wall}"
        )
        assert f"wall time: {longest}." in render(r)


def test_the_target_counts_the_recipes_own_steps(plans):
    for name, (recipe, r) in plans.items():
        assert r.target.steps == recipe.steps, name
        steps = f"{recipe.steps:,} step{'' if recipe.steps == 1 else 's'}"
        assert f"   {steps} predicted in" in render(r), name


def test_every_count_takes_the_right_number():
    texts = {name: render(_plan(name)[1]) for name in RECIPES}
    texts |= {f"{name} {' '.join(o)}": render(_plan(name, o)[1]) for name, o in VARIANTS}
    texts["grpo_tiny_cpu, one measured step"] = render(_plan("grpo_tiny_cpu", measured=ONE_STEP_MEASURED)[1])
    for name, text in texts.items():
        wrong = sorted({m.group(0) for m in ONE_AND_PLURAL.finditer(text) if m.group(1) not in NOT_NOUNS})
        assert not wrong, f"{name}: {wrong}"
        assert "(s)" not in text, f"{name}: a hedged plural"
        assert not re.search(r"\ba (?:8|11\b|18\b)", text), f"{name}: 'a' before eight, eleven or eighteen"
    # The counts of one that the variants reach, each in its singular.
    assert "every step" in texts["grpo_tiny_cpu checkpoint.interval=1"]
    assert "   1 step predicted in" in texts["grpo_qwen2.5-7b_1n8g steps=1"]
    assert "Calibration from 1 measured step (" in texts["grpo_tiny_cpu, one measured step"]
    assert "1 node x 2 = 2 GPUs" in texts["grpo_tiny_cpu"] and "1 x TP1 engine," in texts["grpo_tiny_cpu"]
