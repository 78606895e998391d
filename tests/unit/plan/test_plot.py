"""The picture (`plan --plot`) draws what the text says, and nothing in it hides anything else.

Issue 36: the 7B picture drew a 66 s split while the text ranked a 44.1 s layout first, its title
rounded the steps to other numbers than the text's, and the legend sat on the "seconds" label.
"""

from __future__ import annotations

import pytest

from megatron_rl.config.load import load_recipe, shipped_recipes
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.plan.plot import STEPS, figure, gantt, picture
from megatron_rl.plan.render import render
from megatron_rl.plan.report import build_report
from megatron_rl.plan.wording import num
from megatron_rl.run import resolve

RECIPES = sorted(shipped_recipes())


def _report(name: str, with_search: bool = True):
    run = resolve(load_recipe(name))
    return build_report(inputs_from_run(run), run.layout, with_search=with_search)


@pytest.fixture(scope="module")
def reports():
    return {name: _report(name) for name in RECIPES}


def _drawn_seconds(drawn) -> list[float]:
    return [sum(d for _, _, d in lane.bars) for lane in drawn.lanes]


def test_the_picture_draws_the_recipe_and_the_layout_ranked_first(reports):
    for name, r in reports.items():
        drawn = picture(r)
        own, first = r.layout, r.search.ranked[0]
        assert drawn[0].describe == own.describe and drawn[0].step_s == pytest.approx(r.seconds.step), name
        if first.describe == own.describe:
            assert len(drawn) == 1, name
            continue
        assert [d.role for d in drawn] == ["this recipe", "ranked first"], name
        assert drawn[1].describe == first.describe and drawn[1].step_s == pytest.approx(first.step_s), name
        text = render(r)
        assert f"1   {first.describe}" in text or f"1  {first.describe}" in text, name  # the text's #1
        # Every lane draws its layout's phases: a serial lane STEPS whole steps, an overlapped lane's trainer
        # STEPS learning paths.
        for d, row in ((drawn[0], None), (drawn[1], first)):
            seconds = _drawn_seconds(d)
            if len(d.lanes) == 1:
                assert seconds[0] == pytest.approx(STEPS * d.step_s), f"{name}: {d.role}"
            else:
                assert seconds[1] == pytest.approx(STEPS * row.learning_s), f"{name}: {d.role}"


def test_without_the_search_the_picture_draws_the_overlapped_option_of_the_text():
    r = _report("grpo_qwen2.5-7b_1n8g", with_search=False)
    drawn = picture(r)
    assert [d.describe for d in drawn] == [r.layout.describe, r.overlap.describe]
    assert drawn[1].step_s == pytest.approx(r.seconds.overlapped_cycle)


def test_the_title_gives_each_step_as_the_text_prints_it(reports):
    import matplotlib.pyplot as plt

    r = reports["grpo_qwen2.5-7b_1n8g"]
    fig = figure(r)
    title = fig.axes[0].get_title()
    plt.close(fig)
    assert f"this recipe {num(r.seconds.step)} s per step" in title
    assert f"ranked first {num(r.search.ranked[0].step_s)} s per step" in title
    assert r.layout.describe in title and r.search.ranked[0].describe in title


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize(("name", "with_search"), [("grpo_tiny_cpu", False), ("grpo_qwen2.5-7b_1n8g", True)])
def test_the_legend_covers_no_label_and_no_bar_and_everything_is_inside_the_picture(name, with_search):
    """A one-lane picture (the tiny recipe without the search) is where the legend used to cover "seconds"."""
    import matplotlib.pyplot as plt

    fig = figure(_report(name, with_search))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    texts = [ax.xaxis.label, ax.title, *ax.get_yticklabels(), *ax.get_xticklabels()]
    for text in texts:
        assert not _overlap(box, text.get_window_extent(renderer)), text.get_text()
    assert not _overlap(box, ax.get_window_extent(renderer))  # the bars
    whole = fig.bbox
    for artist in (legend, *texts):
        b = artist.get_window_extent(renderer)
        assert whole.x0 <= b.x0 and b.x1 <= whole.x1 and whole.y0 <= b.y0 and b.y1 <= whole.y1, artist
    shown = [t.get_text() for t in legend.get_texts()]
    drawn = {bar[0] for d in picture(_report(name, with_search)) for lane in d.lanes for bar in lane.bars}
    assert set(shown) == drawn  # one entry per phase drawn, none for a phase that is not
    plt.close(fig)


def test_gantt_writes_a_png(tmp_path):
    out = gantt(_report("grpo_tiny_cpu"), tmp_path / "plan")
    assert out == tmp_path / "plan.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
