"""The typed report and its `--json` dict are the same data: what the text renderer reads is what
`--json` readers get, for every shipped recipe, calibrated or not."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from megatron_rl.cli.plan import _clean
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.calibrate import calibrate, summarize
from megatron_rl.plan.cycle import cycle
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.plan.render import render
from megatron_rl.plan.report import REQUIRED_KEYS, build_report, lookup
from megatron_rl.plan.report_types import PlanReport, Scoring, from_dict
from megatron_rl.run import resolve

# The top-level `--json` keys, in their order (readers may rely on both); calibration and search
# follow when present.
TOP = [
    "recipe",
    "units",
    "assumptions",
    "model",
    "cluster",
    "layout",
    "weights_bytes",
    "kv_bytes_per_token",
    "tokens",
    "flops",
    "gpu_seconds",
    "generation",
    "scoring",
    "seconds",
    "phases_s",
    "overlap",
    "splits",
    "publication",
    "memory_gib",
    "reliability",
    "target",
    "cost",
    "meets_target",
    "dominant",
    "calibrated",
]
# JSON keys that are not attribute names: a CycleRow's description, a checkpoint's async flag.
ALIASES = {"layout": "describe", "async": "async_save"}


def _plan(name: str, with_search: bool = False, calibration: dict | None = None) -> PlanReport:
    from megatron_rl.config.load import load_recipe

    recipe = load_recipe(name)
    inp, layout = inputs_from_run(resolve(recipe)), ParallelLayout.from_config(recipe.layout)
    if calibration is not None:
        calibration = calibrate(inp, layout, cycle(inp, layout), summarize(calibration["records"]))
    return build_report(inp, layout, calibration=calibration, with_search=with_search)


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    else:
        yield path, node


def _typed_at(report: PlanReport, path: tuple) -> Any:
    """The typed value at a JSON path: attributes by key, items of mappings and tuples."""
    node: Any = report
    for part in path:
        if isinstance(part, int):
            node = node[part]
        elif isinstance(node, Mapping):
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        elif hasattr(node, ALIASES.get(part, "")):
            node = getattr(node, ALIASES[part])
        else:  # the step's phases sit inline among `seconds`
            node = node.phases[part]
    return node


def _shipped() -> list[str]:
    from megatron_rl.config.load import shipped_recipes

    names = sorted(shipped_recipes())
    assert names
    return names


def test_required_keys_are_the_typed_fields_and_finite_for_every_shipped_recipe():
    for name in _shipped():
        report = _plan(name)
        data = report.to_json()
        moe = ["alltoall"] if report.model.active_params is not None else []  # a mixture of experts
        assert list(data) == TOP + moe, name
        for key in REQUIRED_KEYS:
            value = lookup(data, key)
            typed = _typed_at(report, tuple(key.split(".")))
            assert value == typed and type(value) is type(typed), (name, key)
            if key == "meets_target":
                assert isinstance(value, bool), (name, key)
            elif key == "seconds.overlapped_cycle" and value is None:
                assert report.overlap is None, name  # no overlapped option fits these GPUs
            else:
                assert isinstance(value, int | float) and math.isfinite(value), (name, key)
        # The text reads the same fields; it names the sequences and the verdict the JSON holds.
        text = render(report)
        assert f"1. Tokens per step: {report.tokens.sequences:,} sequences" in text, name
        assert ("MET" if data["meets_target"] else "NOT MET") in text, name


def test_every_json_value_is_the_typed_value_at_its_path():
    for name in _shipped():
        report = _plan(name)
        data = report.to_json()
        for path, value in _leaves(data):
            typed = _typed_at(report, path)
            assert value == typed and type(value) is type(typed), (name, path)
        # What --json prints reads back as the same dict (non-finite numbers aside).
        assert json.loads(json.dumps(_clean(data))) == _clean(data), name


def test_calibration_and_search_sections_follow_in_order():
    records = [
        {"step": i, "phases": {"init": {"seconds": 9.0}, "generation": {"seconds": 1.0 + i}}}
        for i in range(3)
    ]
    calibrated = _plan("grpo_tiny_cpu", with_search=True, calibration={"records": records})
    data = calibrated.to_json()
    assert list(data) == [*TOP, "calibration", "search"]
    assert data["calibrated"] is True and data["calibration"]["steps"] == 3
    assert data["calibration"]["measured_s"] == {"generation": 2.0}
    for path, value in _leaves(data):
        assert _typed_at(calibrated, path) == value, path
    assert "Calibration from 3 measured steps" in render(calibrated)


def test_a_section_refuses_a_key_it_has_no_field_for():
    scoring = {
        "core_seconds": 1.0,
        "waves": 1,
        "serial_s": 1.0,
        "exposed_s": 0.5,
        "hidden_s": 0.5,
        "turns": 1,
        "behind_forwards_s": 0.0,
        "fleet_nodes": 2,
        "fleet_cpus_per_node": 64,
        "fleet_nodes_to_keep_up": 3,
    }
    assert dataclasses.asdict(from_dict(Scoring, scoring)) == scoring
    with pytest.raises(TypeError, match="queue_s"):
        from_dict(Scoring, scoring | {"queue_s": 2.0})
