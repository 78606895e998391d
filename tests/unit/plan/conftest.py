"""Fixtures: the reference recipe, loaded once (the hand case lives in hand.py)."""

from __future__ import annotations

import pytest

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import PlanInputs, inputs_from_run
from megatron_rl.run import resolve

from .hand import REFERENCE


@pytest.fixture(scope="session")
def ref_recipe():
    from megatron_rl.config.load import load_recipe

    return load_recipe(REFERENCE)


@pytest.fixture(scope="session")
def ref(ref_recipe) -> tuple[PlanInputs, ParallelLayout]:
    return inputs_from_run(resolve(ref_recipe)), ParallelLayout.from_config(ref_recipe.layout)
