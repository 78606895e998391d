"""The planner's memory moments that a colocated GPU run goes through besides training and
generation: the frozen reference (resident or offloaded, algorithm.reference) and the engine's
construction, when vLLM claims gpu_memory_utilization x the GPU while the trainer keeps its params.
"""

import dataclasses

import pytest

from megatron_rl.config.load import load_recipe
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.cycle import switch_seconds
from megatron_rl.plan.inputs import GIB, inputs_from_run
from megatron_rl.plan.memory import memory_fit, trainer_memory
from megatron_rl.run import resolve

R70B = "grpo_llama3.1-70b_8n8g"


def _plan(overrides=()):
    recipe = load_recipe(R70B, list(overrides))
    return inputs_from_run(resolve(recipe)), ParallelLayout.from_config(recipe.layout)


def test_a_resident_reference_is_counted_while_training_and_generating():
    inp, lay = _plan()
    assert inp.work.reference_forward and inp.assume.reference == "resident"
    m = trainer_memory(inp, lay)
    assert m["reference"] == pytest.approx(m["params"])
    assert m["resident_while_generating"] == pytest.approx(m["params"] + m["reference"] + m["runtime"])
    # Without a KL there is no reference to count.
    no_kl = trainer_memory(
        dataclasses.replace(inp, work=dataclasses.replace(inp.work, reference_forward=False)), lay
    )
    assert no_kl["reference"] == 0.0 and no_kl["total"] == pytest.approx(m["total"] - m["reference"])


def test_an_offloaded_reference_is_counted_only_for_its_forward():
    inp, lay = _plan(["algorithm.reference=offload"])
    m = trainer_memory(inp, lay)
    assert m["reference"] == 0.0
    assert m["resident_while_generating"] == pytest.approx(m["params"] + m["runtime"])
    # Its forward: the policy's training state (no backward activations) plus the reference weights.
    expected = m["total"] - m["activations"] + m["params"]
    assert m["reference_logprobs_total"] == pytest.approx(expected)


def test_engine_construction_is_a_moment_that_can_fail():
    inp, lay = _plan()
    fit = memory_fit(inp, lay)
    tr, cap = fit["trainer"], inp.hw.gpu_memory_bytes
    constructing = tr["resident_at_engine_construction"] + inp.assume.gpu_memory_utilization * cap
    assert fit["fits"] and fit["peak"] >= constructing
    # The trainer steps aside (optimizer, grads, reference) but its params stay.
    assert tr["resident_at_engine_construction"] == pytest.approx(tr["params"] + tr["runtime"])
    # A utilisation that leaves no room for the trainer's params is refused, naming the moment.
    greedy = dataclasses.replace(inp, assume=dataclasses.replace(inp.assume, gpu_memory_utilization=0.95))
    fit = memory_fit(greedy, lay)
    assert not fit["fits"]
    assert any("building the engine" in r and "gpu_memory_utilization" in r for r in fit["reasons"])
    assert fit["peak"] / GIB > inp.hw.gpu_memory_bytes / GIB


def test_in_place_delivery_discards_engine_weights_instead_of_copying_them():
    inp, lay = _plan()
    assert inp.assume.sleep_level == 2, "GPU clusters publish in place: sleep level 2"
    mem = memory_fit(inp, lay)
    tr = mem["trainer"]
    assert switch_seconds(inp, lay, mem) == pytest.approx(
        2 * (tr["grads"] + tr["optimizer"]) / inp.hw.host_link_bytes_per_s
    )
    level1, _ = _plan(["rollout.sleep_level=1"])
    assert level1.assume.sleep_level == 1
    extra = switch_seconds(level1, lay, memory_fit(level1, lay)) - switch_seconds(inp, lay, mem)
    assert extra == pytest.approx(2 * mem["engine"]["weights"] / inp.hw.host_link_bytes_per_s)


def test_validate_refuses_a_utilisation_that_cannot_be_built():
    from megatron_rl.check.recipe import ConfigError, validate_recipe

    validate_recipe(load_recipe(R70B, []), "validate")  # its checkpoint lives on the cluster
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization.*building the engine"):
        validate_recipe(load_recipe(R70B, ["rollout.gpu_memory_utilization=0.95"]), "validate")
