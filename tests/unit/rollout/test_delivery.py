"""The engine's sleep level follows the publication's delivery (rollout/delivery.py)."""

import pytest

from megatron_rl.check.recipe import ConfigError, validate_recipe
from megatron_rl.config.load import load_recipe
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for


def test_in_place_delivery_discards_weights_loader_delivery_keeps_them():
    assert delivery_for(on_gpu=True) == "inplace" and delivery_for(on_gpu=False) == "loader"
    assert sleep_level_for(0, "inplace") == 2
    assert sleep_level_for(0, "loader") == 1
    # An explicit recipe value wins.
    assert sleep_level_for(1, "inplace") == 1
    assert sleep_level_for(2, "loader") == 2


def test_bad_levels_and_deliveries_are_refused():
    with pytest.raises(ValueError, match="rollout.sleep_level"):
        sleep_level_for(3, "inplace")
    with pytest.raises(ValueError, match="delivery"):
        sleep_level_for(0, "nccl")
    with pytest.raises(ConfigError, match="rollout.sleep_level"):
        validate_recipe(load_recipe("grpo_tiny_cpu", ["rollout.sleep_level=3"]))


def test_shipped_recipes_let_the_delivery_choose():
    for name in ("grpo_tiny_cpu", "grpo_llama3.1-70b_8n8g", "grpo_qwen2.5-32b_32n8g"):
        assert load_recipe(name, []).rollout.sleep_level == 0, name
