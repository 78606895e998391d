"""The refusal policy over a real Publisher (one process): stop, skip, retry, and when the run ends."""

import pytest

from megatron_rl.check.recipe import check_recipe
from megatron_rl.config.load import load_recipe
from megatron_rl.loop.placement.publication import PublicationRefused, RefusalPolicy
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.publish import InMemorySink, Publisher
from tests.helpers.specs import QWEN2_TINY as SPEC
from tests.unit.reshard.oracle import random_hf
from tests.unit.reshard.test_publish_local import CorruptingSink, _trainer

FC2 = "decoder.layers.0.mlp.linear_fc2.weight"


def _policy(name, max_in_a_row=3, sink=None):
    params = _trainer(random_hf(SPEC))
    sink = sink or InMemorySink()
    guard = RefusalPolicy(Publisher(ParallelLayout(), SPEC, sink), name, max_in_a_row)
    return params, sink, guard


def test_stop_goes_on_with_the_active_version_then_ends_the_run_at_the_limit():
    params, sink, guard = _policy("stop")
    assert guard.publish(params.items, 0).activated
    params[FC2][0, 0] = float("nan")
    for step, in_a_row in ((1, 1), (2, 2)):
        r = guard.publish(params.items, step)
        assert not r.activated and r.action == "sampled with the active version 1" and r.attempts == 1
        assert guard.in_a_row == in_a_row and sink.active_version == 1
    with pytest.raises(PublicationRefused, match="refused 3 times in a row.*\n.*non-finite"):
        guard.publish(params.items, 3)


def test_an_activation_resets_the_count():
    params, sink, guard = _policy("stop")
    guard.publish(params.items, 0)
    params[FC2][0, 0] = float("inf")
    guard.publish(params.items, 1)
    guard.publish(params.items, 2)
    params[FC2][0, 0] = 0.0
    assert guard.publish(params.items, 3).activated and guard.in_a_row == 0
    params[FC2][0, 0] = float("inf")
    assert not guard.publish(params.items, 4).activated  # one in a row again, not three


def test_skip_never_stops_while_a_version_serves():
    params, sink, guard = _policy("skip")
    guard.publish(params.items, 0)
    params[FC2][1, 1] = float("nan")
    for step in range(1, 8):
        r = guard.publish(params.items, step)
        assert not r.activated and r.active_version == 1 and "active version 1" in r.action
    assert guard.in_a_row == 7


def test_retry_clears_a_transient_fault_in_the_same_step():
    sink = CorruptingSink()
    params, sink, guard = _policy("retry", sink=sink)
    guard.publish(params.items, 0)
    hits = []

    def once(staged):  # a flipped bit in transit, only on the first attempt
        if not hits:
            staged["model.norm.weight"].view(-1)[0] += 1.0
        hits.append(1)

    sink.damage = once
    r = guard.publish(params.items, 1)
    assert r.activated and r.attempts == 2 and r.version == 3 and sink.active_version == 3


def test_retry_ends_the_run_on_a_persistent_fault():
    params, sink, guard = _policy("retry", max_in_a_row=2)
    guard.publish(params.items, 0)
    params[FC2][0, 0] = float("nan")
    with pytest.raises(PublicationRefused, match="refused 2 times"):
        guard.publish(params.items, 1)
    assert sink.active_version == 1


def test_first_publication_refused_retries_even_under_skip():
    params, sink, guard = _policy("skip", max_in_a_row=3)
    params[FC2][0, 0] = float("nan")
    with pytest.raises(PublicationRefused, match="refused 3 times"):
        guard.publish(params.items, 0)
    assert sink.active_version is None


def test_recipe_values_are_checked():
    cfg = load_recipe(
        "grpo_tiny_cpu", ["rollout.on_refused_publication=ignore", "rollout.max_refused_publications=0"]
    )
    problems = {p.key: p.message for p in check_recipe(cfg)}
    assert "stop, skip, retry" in problems["rollout.on_refused_publication"]
    assert "in [1, " in problems["rollout.max_refused_publications"]
    assert load_recipe("grpo_tiny_cpu").rollout.on_refused_publication == "stop"
    with pytest.raises(ValueError, match="use one of stop, skip, retry"):
        RefusalPolicy(None, "ignore")


# ---- a level-2 sleep discards the active version: nothing is left to sample with ----


class DiscardingSink(InMemorySink):
    """The sink interface of an engine that sleeps at level 2 (the CPU build cannot): `sleep()` discards
    the active version's weights, the next activation brings weights back (VLLMEngineSink.holds_weights)."""

    def __init__(self):
        super().__init__()
        self.holds_weights = False

    def activate(self, version):
        super().activate(version)
        self.holds_weights = True

    def sleep(self):
        self.holds_weights = False


@pytest.mark.parametrize("name", ["stop", "skip"])
def test_after_a_level_2_sleep_a_refusal_retries_instead_of_sampling_discarded_weights(name):
    params, sink, guard = _policy(name, sink=DiscardingSink())
    assert guard.publish(params.items, 0).activated
    sink.sleep()
    params[FC2][0, 0] = float("nan")
    with pytest.raises(PublicationRefused) as ended:
        guard.publish(params.items, 1)
    head = str(ended.value.code).splitlines()[0]
    assert "refused 3 times in a row" in head and "version 1 cannot serve" in head
    assert "rollout.sleep_level=1" in head
    assert sink.active_version == 1 and not sink.holds_weights


def test_after_a_level_2_sleep_a_transient_fault_is_retried_within_the_step():
    sink = CorruptingSink()
    sink.holds_weights = True
    params, sink, guard = _policy("stop", sink=sink)
    guard.publish(params.items, 0)
    sink.holds_weights = False  # asleep at level 2
    hits = []

    def once(staged):
        if not hits:
            staged["model.norm.weight"].view(-1)[0] += 1.0
        hits.append(1)

    sink.damage = once
    r = guard.publish(params.items, 1)
    assert r.activated and r.attempts == 2 and r.action == "" and sink.active_version == 3


def test_a_sink_that_keeps_its_weights_still_samples_with_the_active_version():
    params, sink, guard = _policy("stop", sink=DiscardingSink())
    guard.publish(params.items, 0)  # level 1: no sleep() discards anything
    params[FC2][0, 0] = float("nan")
    assert guard.publish(params.items, 1).action == "sampled with the active version 1"


def test_validate_refuses_skip_at_sleep_level_2():
    def problems(*overrides):
        cfg = load_recipe("grpo_llama3.1-70b_8n8g", ["rollout.on_refused_publication=skip", *overrides])
        return {p.key: p.message for p in check_recipe(cfg)}

    msg = problems()["rollout.on_refused_publication"]  # GPU cluster, level 0 -> 2 (in-place delivery)
    assert "rollout.sleep_level=1" in msg
    assert "rollout.on_refused_publication" in problems("rollout.sleep_level=2")
    assert "rollout.on_refused_publication" not in problems("rollout.sleep_level=1")
    cpu = check_recipe(load_recipe("grpo_tiny_cpu", ["rollout.on_refused_publication=skip"]))
    assert not [p for p in cpu if p.key == "rollout.on_refused_publication"]  # loader delivery: level 1
