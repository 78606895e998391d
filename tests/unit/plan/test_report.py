"""The reference recipe's complete report, the CLI (text, --json, --plot) and its errors."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from megatron_rl.cli.plan import main
from megatron_rl.plan.render import render
from megatron_rl.plan.report import REQUIRED_KEYS, build_report, lookup
from megatron_rl.plan.report_types import PlanReport

from .hand import REFERENCE


@pytest.fixture(scope="module")
def report(ref):
    inp, layout = ref
    return build_report(inp, layout)


def test_every_required_key_resolves_to_a_value(report):
    data = report.to_json()
    for key in REQUIRED_KEYS:
        value = lookup(data, key)
        if key == "meets_target":
            assert isinstance(value, bool)
        else:
            assert isinstance(value, int | float) and math.isfinite(value) and value > 0, key


def test_reference_report_numbers(report):
    assert report.weights_bytes == 65_527_752_704
    assert report.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert report.tokens.prompt == 4096 * 1200
    assert report.tokens.completion == 4096 * 2500
    assert report.tokens.trained == 4096 * 3700
    # GPU-seconds at 40% of 989 TFLOPS
    assert report.gpu_seconds.train == pytest.approx(report.flops.train / (989e12 * 0.4))
    sec = report.seconds
    assert sec.serial_cycle == pytest.approx(sum(report.phases_s.values()))
    assert sec.overlapped_cycle == pytest.approx(max(sec.collection_path, sec.learning_path))
    assert sec.overlapped_cycle < sec.serial_cycle
    assert sec.scoring == 32.0  # 4,096 x 8 s over 1,024 cores, unstreamed
    assert report.memory_gib.fits
    tg = report.target
    assert report.meets_target is (tg.predicted_hours <= 48.0)
    assert tg.steps_in_target >= 600 if report.meets_target else tg.steps_in_target < 600
    assert report.search is not None and report.search.ranked and report.splits


def test_target_depends_on_checkpointing(ref):
    inp, layout = ref

    def plan(interval: int) -> PlanReport:
        assume = dataclasses.replace(inp.assume, checkpoint_interval_steps=interval)
        return build_report(dataclasses.replace(inp, assume=assume), layout, with_search=False)

    never, young_daly = plan(0), plan(-1)
    # ~2.2 node failures in a 33 h run: restarting from step 0 each time blows the 48 h target ...
    assert never.reliability.interval_source == "never" and never.meets_target is False
    assert never.target.predicted_hours_with_young_daly == pytest.approx(young_daly.target.predicted_hours)
    # ... saving at the Young/Daly interval meets it with hours to spare.
    assert young_daly.meets_target is True and young_daly.target.steps_in_target > 600
    assert young_daly.reliability.expected_lost_s < 3600


def test_reference_phase_that_dominates(report):
    d = report.dominant
    # The tail (16,384 tokens at TP4) outlasts the whole training phase on 256 GPUs ...
    assert d.wall == "generation"
    assert report.seconds.longest_completion_floor > d.wall_s["train"]
    # ... though generation's work is about the size of training's.
    assert d.gpu_seconds in ("train", "generation")
    assert "longest completion" in d.why


def test_text_report_states_units_and_sections(report):
    text = render(report)
    assert "decimal GB" in text and "GiB" in text and "Gb/s / 8" in text
    for section in (
        "1. Tokens",
        "2. Compute",
        "3. Generation",
        "4. Scoring",
        "5. Cycle",
        "6. Weight publication",
        "7. Memory per GPU",
        "8. Checkpoints",
        "9. Target",
        "10. Cost",
        "11. Layout search",
        "Which phase dominates",
    ):
        assert section in text
    assert "longest completion" in text and "Young/Daly" in text


def test_cli_json_and_plot(tmp_path, capsys):
    png = tmp_path / "gantt.png"
    assert main([REFERENCE, "--json", "--no-search", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in REQUIRED_KEYS:
        lookup(data, key)
    assert "search" not in data
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_cli_text_with_overrides(capsys):
    # overrides and options in any order
    assert main([REFERENCE, "cluster.nodes=16", "--top", "3", "layout.dp=8", "layout.engine_count=32"]) == 0
    out = capsys.readouterr().out
    assert "16 nodes x 8 = 128 GPUs" in out and "Layout search over 128 GPUs" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["rollout.mean_completion_tokens=20000"],
            "rollout.mean_completion_tokens=20000: exceeds rollout.max_new_tokens",
        ),
        (["cluster.nodes=8"], "trainer world tp x pp x dp x cp = 256 must equal cluster.nodes x"),
        (["plan.train_mfu=1.5"], "plan.train_mfu=1.5: must be finite and in (0, 1]"),
        (["layout.engine_count=32"], "engine_tp x engine_count = 128 must cover the 256 GPUs when colocated"),
        (["model.nope=1"], "nope"),
    ],
)
def test_cli_bad_input_names_the_key(capsys, args, message):
    assert main([REFERENCE, *args, "--no-search"]) == 2
    assert message in capsys.readouterr().err


def test_cli_unknown_recipe(capsys):
    assert main(["no_such_recipe"]) == 2
    assert "no recipe named 'no_such_recipe'" in capsys.readouterr().err


def test_every_shipped_recipe_plans(capsys):
    from megatron_rl.config.load import shipped_recipes

    names = sorted(shipped_recipes())
    assert names
    for name in names:
        assert main([name, "--json", "--no-search"]) == 0, name
        data = json.loads(capsys.readouterr().out)
        for key in REQUIRED_KEYS:
            lookup(data, key)
