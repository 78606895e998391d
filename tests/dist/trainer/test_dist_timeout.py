"""The process-group timeout is the recipe's `cluster.dist_timeout_s` on every group a run makes
(the default group, the CPU group, megatron-core's groups), not a fixed 600 s."""

import json

import pytest

from megatron_rl.check.recipe import ConfigError, validate_recipe
from megatron_rl.config.load import load_recipe
from tests.helpers.launch import free_port, run_worker

pytestmark = pytest.mark.slow
WORKER = "tests/dist/trainer/worker_timeout.py"


def test_every_group_gets_the_recipe_timeout(tmp_path):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    run_worker(WORKER, [str(tmp_path), "4321"], timeout=300, env=env)
    timeouts = json.loads((tmp_path / "timeouts.json").read_text())
    # megatron-core counts its timeout in whole minutes: 4321 s -> 72 min.
    assert timeouts == {
        "default": 4321.0,
        "cpu_group": 4321.0,
        "tensor_parallel": 4320.0,
        "data_parallel": 4320.0,
    }


def test_default_is_half_an_hour_and_short_ones_are_refused():
    assert load_recipe("grpo_tiny_cpu", []).cluster.dist_timeout_s == 1800.0
    for bad in ("30", "0", "-5", "inf"):
        with pytest.raises(ConfigError, match="cluster.dist_timeout_s"):
            validate_recipe(load_recipe("grpo_tiny_cpu", [f"cluster.dist_timeout_s={bad}"]))
    validate_recipe(load_recipe("grpo_tiny_cpu", ["cluster.dist_timeout_s=7200"]))
