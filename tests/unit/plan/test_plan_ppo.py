"""PPO's four models on the colocated GPUs, counted by the planner one by one (plan/models.py, memory.py):
the 70B PPO recipe's breakdown checked by hand against the bytes per trained parameter, the moments each
model is on the device, the critic's and the reward model's FLOPs, and the reasons naming the model that
does not fit.

Bytes per trained bf16 parameter: 2 (params) + 4 (megatron's fp32 main grads: trainer/policy.py sets
grad_reduce_in_fp32) + 12 (fp32 master copy, Adam m and v) = 18 unsharded, 6 + 12 / (DP x CP) with the
distributed optimizer: 9 at DP4. (The 16 B/param often quoted counts bf16 grads.)

Llama-3.1-70B by hand: h 8192, 64 heads x 128 = q 8192, 8 KV heads x 128 = kv 1024, FFN 28672, 80 layers,
vocabulary 128,256 padded to a multiple of 128 x TP8 = 129,024 rows.
    one layer: QKV 8192 x (8192 + 2 x 1024) = 83,886,080; proj 8192^2 = 67,108,864;
               SwiGLU 3 x 8192 x 28672 = 704,643,072; norms 2 x 8192 -> 855,654,400
At TP8 x PP4 x DP4 the first stage holds 20 layers + the embedding:
    20 x 855,654,400 + 129,024 x 8192 = 18,170,052,608 -> 2,271,256,576 per GPU (TP8)
for the policy, the critic (the policy's body) and the reference alike; the critic's last stage holds
its final norm and a 1-output value head (2 x 8192) instead of the policy's 8192 + 129,024 x 8192.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from megatron_rl.config.load import load_recipe, shipped_recipes
from megatron_rl.plan import memory_per_gpu
from megatron_rl.plan.cycle import COLLECTION, LEARNING, PHASES, cycle, switch_seconds, trainer_phases
from megatron_rl.plan.flops import (
    critic_flops,
    logprob_forward_flops,
    recompute_extra_flops,
    reward_model_flops,
    train_flops,
)
from megatron_rl.plan.inputs import GIB, inputs_from_run
from megatron_rl.plan.memory import memory_fit, trainer_memory
from megatron_rl.plan.models import LM, VALUE, stage_params_of
from megatron_rl.plan.plot import COLORS
from megatron_rl.plan.render import render
from megatron_rl.plan.report import build_report
from megatron_rl.run import resolve

PPO70 = "ppo_llama3.1-70b_16n8g"
LAYER = 855_654_400
ROWS = 129_024 * 8192
STAGE0_PER_GPU = (20 * LAYER + ROWS) / 8  # 2,271,256,576
TP, PP, DP, CP = 8, 4, 4, 1


def _plan(name=PPO70, overrides=()):
    run = resolve(load_recipe(name, list(overrides)))
    return run, inputs_from_run(run), run.layout


@pytest.fixture(scope="module")
def ppo():
    return _plan()


def test_the_recipe_is_the_layout_the_hand_count_assumes(ppo):
    run, inp, lay = ppo
    assert (lay.tp, lay.pp, lay.dp, lay.cp, lay.colocated) == (TP, PP, DP, CP, True)
    assert run.recipe.algorithm.name == "ppo" and inp.critic is not None and inp.reward_model is not None
    assert inp.spec.layer_params() == LAYER and inp.spec.padded_vocab(TP) * 8192 == ROWS
    assert STAGE0_PER_GPU == 2_271_256_576
    assert inp.assume.distributed_optimizer and inp.spec.params_dtype == "bf16"


def test_each_trained_model_costs_18_bytes_per_parameter_with_the_optimizer_sharded(ppo):
    _, inp, lay = ppo
    m = trainer_memory(inp, lay)
    assert m["stage"] == 0  # the first stage: 4 microbatches of activations in flight
    for role in ("policy", "critic"):
        model = m["by_model"][role]
        n = model["parameters"]
        assert n == pytest.approx(STAGE0_PER_GPU), role
        assert model["params"] == pytest.approx(2 * n), role
        assert model["grads"] == pytest.approx(4 * n), role
        assert model["optimizer"] == pytest.approx(12 * n / (DP * CP)), role
        assert model["params"] + model["grads"] + model["optimizer"] * DP * CP == pytest.approx(18 * n), role
        assert model["state"] == pytest.approx(n * (2 + 4 + 12 / (DP * CP))), role
        assert model["bytes_per_param"] == pytest.approx(9.0) and model["optimizer_shards"] == DP * CP, role
    # The trainer's own parts are the policy's; the critic's training state is counted beside them.
    assert m["params"] == pytest.approx(2 * STAGE0_PER_GPU)
    assert m["critic"] == pytest.approx(9 * STAGE0_PER_GPU)


def test_a_critic_at_its_own_layout_is_counted_at_it():
    """critic.pp=2 beside the policy's TP8 x PP4 x DP4: the critic runs at TP8 x PP2 x DP8 (plan/models.py
    critic_layout, as ParallelLayout.for_model gives the driver). Its heaviest stage, the first (40 layers and
    the embedding), sits beside every policy stage: twice the parameters per GPU, the optimizer sharded over
    DP8, so 2 + 4 + 12 / 8 = 7.5 bytes per parameter; and its passes are timed at that layout."""
    _, inp, lay = _plan(overrides=["critic.pp=2"])
    assert (inp.critic.tp, inp.critic.pp) == (0, 2)
    c = trainer_memory(inp, lay)["by_model"]["critic"]
    n = (40 * LAYER + ROWS) / 8
    assert c["parameters"] == pytest.approx(n)
    assert c["optimizer_shards"] == 8 and c["bytes_per_param"] == pytest.approx(7.5)
    _, same, _ = _plan()
    own, shared = trainer_phases(inp, lay), trainer_phases(same, lay)
    assert own["critic_train"] != pytest.approx(shared["critic_train"])
    assert own["train_fwd_bwd"] == pytest.approx(shared["train_fwd_bwd"])  # the policy's own are unchanged


def test_the_search_rejects_a_layout_the_critic_cannot_split():
    """critic.tp=3 divides none of the 128 ranks: every candidate is refused for it, by name, before memory
    is counted; critic.pp=2 splits them (DP8 over a 256-sequence minibatch), so the recipe's layout passes."""
    from megatron_rl.plan.search import structural_reason

    _, bad, lay = _plan(overrides=["critic.tp=3"])
    reason = structural_reason(bad, lay)
    assert "critic.tp x critic.pp = 3 x 4 does not divide the trainer's 128 ranks" in reason
    _, ok, lay = _plan(overrides=["critic.pp=2"])
    assert structural_reason(ok, lay) is None


def test_the_frozen_models_hold_two_bytes_per_parameter(ppo):
    run, inp, lay = ppo
    by = trainer_memory(inp, lay)["by_model"]
    # The reward model's config.json is not here: its shape is assumed to be the policy's (run.assumed).
    assert "reward.model_checkpoint" in run.assumed
    for role in ("reference", "reward_model"):
        assert by[role]["parameters"] == pytest.approx(STAGE0_PER_GPU), role
        assert by[role]["params"] == pytest.approx(2 * STAGE0_PER_GPU), role
        assert "grads" not in by[role] and "optimizer" not in by[role], role
    assert by["reference"]["on_device"].startswith("for its forward")  # algorithm.reference=offload


def test_memory_per_gpu_gives_the_breakdown_in_gib(ppo):
    run, _, _ = ppo
    mem = memory_per_gpu(run)
    by = mem["by_model"]
    assert list(by) == ["policy", "critic", "reference", "reward_model"]
    assert by["critic"]["parameters"] == pytest.approx(STAGE0_PER_GPU)  # a count, not GiB
    assert by["critic"]["state"] == pytest.approx(9 * STAGE0_PER_GPU / GIB)
    assert by["reward_model"]["params"] == pytest.approx(2 * STAGE0_PER_GPU / GIB)
    assert mem["assumed"] == ("reward.model_checkpoint",)
    assert mem["fits"] and mem["peak_per_gpu"] <= 80.0
    assert mem["peak_per_gpu"] == pytest.approx(max(mem["moments"].values()))
    # validate's figure is the training moment, the critic's state included
    assert mem["trainer_per_gpu"] > by["policy"]["state"] + by["critic"]["state"]


def test_the_last_stage_holds_a_value_head_not_the_vocabulary(ppo):
    _, inp, lay = ppo
    h = 8192
    assert stage_params_of(inp.critic.spec, lay, VALUE)[-1] == 20 * LAYER + 2 * h
    assert stage_params_of(inp.spec, lay, LM)[-1] == 20 * LAYER + h + ROWS
    assert stage_params_of(inp.critic.spec, lay, VALUE)[0] == stage_params_of(inp.spec, lay, LM)[0]


def test_each_moment_holds_the_models_on_the_device_then(ppo):
    _, inp, lay = ppo
    fit = memory_fit(inp, lay)
    tr, en, by, mo = fit["trainer"], fit["engine"], fit["by_model"], fit["moments"]
    pol, cri, ref, rm = by["policy"], by["critic"], by["reference"], by["reward_model"]
    sleeping, runtime = en["resident_while_training"], tr["runtime"]
    working = max(pol["activations"] + pol["logits"], cri["activations"] + cri["values"])
    assert mo["training"] == pytest.approx(pol["state"] + cri["state"] + working + runtime + sleeping)
    # While the engines generate and are built, both trained models keep only their weights.
    assert mo["generating"] == pytest.approx(en["total"] + pol["params"] + cri["params"] + runtime)
    util = inp.assume.gpu_memory_utilization * inp.hw.gpu_memory_bytes
    assert mo["constructing"] == pytest.approx(util + pol["params"] + cri["params"] + runtime)
    # The offloaded reference and the reward model each come for their forward, beside both training states.
    states = pol["state"] + cri["state"] + runtime + sleeping
    assert mo["reference_forward"] == pytest.approx(states + pol["logits"] + ref["params"])
    assert mo["reward_model_forward"] == pytest.approx(states + rm["params"] + rm["activations"])
    assert fit["peak"] == pytest.approx(max(mo.values()))
    # The colocated switch moves both trained models' grads and optimizer state, out and back.
    moved = 2 * (pol["grads"] + pol["optimizer"] + cri["grads"] + cri["optimizer"])
    assert switch_seconds(inp, lay, fit) == pytest.approx(moved / inp.hw.host_link_bytes_per_s)


def test_a_critic_that_does_not_fit_names_itself():
    _, inp, lay = _plan(overrides=["layout.pp=2", "layout.dp=8"])
    fit = memory_fit(inp, lay)
    assert not fit["fits"]
    (reason,) = [r for r in fit["reasons"] if r.startswith("trainer needs")]
    assert (
        "critic" in reason and "algorithm.name=ppo" in reason and "without the critic it would fit" in reason
    )
    # ... and it is the critic: the same layout without one fits.
    assert memory_fit(dataclasses.replace(inp, critic=None), lay)["fits"]
    from megatron_rl.check.recipe import ConfigError, validate_recipe

    with pytest.raises(ConfigError, match="memory"):  # validate refuses it, counting the critic
        validate_recipe(load_recipe(PPO70, ["layout.pp=2", "layout.dp=8"]), "validate")


def test_a_reward_model_that_does_not_fit_names_its_key(ppo):
    _, inp, lay = ppo
    big = dataclasses.replace(inp.reward_model, num_layers=800)  # 200 layers a stage: 40 GiB of weights
    fit = memory_fit(dataclasses.replace(inp, reward_model=big), lay)
    assert not fit["fits"]
    assert any(r.startswith("the reward model's forward (reward.model_checkpoint)") for r in fit["reasons"])


def test_the_critic_forward_is_the_policy_forward_with_a_value_head(ppo):
    _, inp, lay = ppo
    w, s = inp.work, inp.spec
    tokens = w.samples * w.sequence_tokens
    policy_forward = logprob_forward_flops(inp)["old"]
    assert policy_forward > 0  # PPO folds the KL into the rewards: the old log-probs are recomputed
    cf = critic_flops(inp, lay.recompute)
    # The same body; the vocabulary's output layer (2 x V x h per token) gives way to 2 x h.
    assert cf["values"] == pytest.approx(
        policy_forward - 2 * tokens * (s.vocab_size * s.hidden_size - s.hidden_size)
    )
    assert cf["train"] == pytest.approx(3 * cf["values"])  # forward + backward, one pass
    assert cf["recompute_extra"] == pytest.approx(recompute_extra_flops(inp, lay.recompute))
    # The reward model, of the policy's shape (assumed), runs one forward of the same body over every sequence.
    assert reward_model_flops(inp) == pytest.approx(cf["values"])
    phases = trainer_phases(inp, lay)
    rate = lay.trainer_gpus * inp.hw.peak_flops * inp.assume.train_mfu
    assert phases["critic_values"] >= cf["values"] / rate
    assert phases["critic_train"] >= (cf["train"] + cf["recompute_extra"]) / rate


@pytest.mark.parametrize("name", [PPO70, "grpo_llama3.1-70b_8n8g"])
def test_two_epochs_double_the_training(name):
    _, one, lay = _plan(name)
    _, two, _ = _plan(name, ["algorithm.epochs=2"])
    assert two.work.epochs == 2 and one.work.epochs == 1
    assert train_flops(two) == pytest.approx(2 * train_flops(one))
    assert recompute_extra_flops(two, lay.recompute) == pytest.approx(
        2 * recompute_extra_flops(one, lay.recompute)
    )
    p1, p2 = trainer_phases(one, lay), trainer_phases(two, lay)
    for phase in ("train_fwd_bwd", "optimizer") + (("critic_train",) if one.critic else ()):
        assert p2[phase] == pytest.approx(2 * p1[phase]), phase
    for phase in ("old_logprobs", "ref_logprobs", "critic_values", "reward_model"):
        assert p2.get(phase) == pytest.approx(p1.get(phase)), phase  # once per step, whatever the epochs
    if one.critic:
        c1, c2 = critic_flops(one, lay.recompute), critic_flops(two, lay.recompute)
        assert c2["train"] == pytest.approx(2 * c1["train"]) and c2["values"] == pytest.approx(c1["values"])


def test_a_second_epoch_needs_the_old_logprobs_recomputed():
    _, one, _ = _plan("grpo_qwen2.5-7b_1n8g", ["algorithm.minibatches=1"])
    _, two, _ = _plan("grpo_qwen2.5-7b_1n8g", ["algorithm.minibatches=1", "algorithm.epochs=2"])
    assert not one.work.old_forward and two.work.old_forward


def test_the_new_phases_are_learning_and_recorded_under_the_loops_names(ppo):
    from megatron_rl.telemetry.phases import PHASES as RECORDED

    _, inp, lay = ppo
    c = cycle(inp, lay)
    side = ("reward_model", "critic_values", "critic_train")
    assert all(c.phases[p] > 0 for p in side)
    for p in side:
        assert p in PHASES and p in LEARNING and p not in COLLECTION and p in COLORS and p in RECORDED, p
    assert set(c.phases) - {"switch"} <= set(PHASES)
    assert c.serial_s == pytest.approx(sum(c.phases.values()))


def test_grpo_recipes_have_no_critic_nor_reward_model():
    for name in sorted(shipped_recipes()):
        if (
            not name.startswith("grpo_") or name == "grpo_tiny_hf_cpu"
        ):  # the hf recipe's fixture is built at run
            continue
        _, inp, lay = _plan(name)
        assert inp.critic is None and inp.reward_model is None, name
        fit = memory_fit(inp, lay)
        assert set(fit["by_model"]) <= {"policy", "reference"}, name
        assert "critic" not in fit["trainer"] and "reward_model_forward_total" not in fit["trainer"], name
        assert critic_flops(inp, lay.recompute)["total"] == 0.0 and reward_model_flops(inp) == 0.0, name
        assert not {"reward_model", "critic_values", "critic_train"} & set(cycle(inp, lay).phases), name
        policy = fit["by_model"]["policy"]
        assert policy["params"] == pytest.approx(fit["trainer"]["params"]), name


def test_the_plan_prints_the_breakdown_and_the_assumed_shape(ppo, capsys):
    from megatron_rl.cli.plan import main

    _, inp, lay = ppo
    report = build_report(inp, lay, with_search=False)
    text = render(report)
    assert "SHAPE ASSUMED: reward.model_checkpoint" in text
    assert "by model, per GPU of PP stage 0" in text
    for row in ("policy ", "critic ", "reference ", "reward model "):
        assert any(line.strip().startswith(row) and "2.27 B" in line for line in text.splitlines()), row
    assert "9 = 2 + 4 + 12/4" in text and "critic training (6·P_c + attention)" in text
    assert main([PPO70, "--json", "--no-search"]) == 0
    data = json.loads(capsys.readouterr().out)
    mem = data["memory_gib"]
    assert set(mem["by_model"]) == {"policy", "critic", "reference", "reward_model"}
    assert mem["by_model"]["critic"]["state"] == pytest.approx(9 * STAGE0_PER_GPU / GIB)
    assert mem["by_model"]["reference"]["params"] == pytest.approx(2 * STAGE0_PER_GPU / GIB)
    assert set(data["flops"]["by_model"]) == {"policy", "critic", "reference", "reward_model"}
    assert data["flops"]["critic_values"] == pytest.approx(critic_flops(inp, lay.recompute)["values"])
    assert data["model"]["reward_model"]["shape_assumed"] is True
    assert data["model"]["critic"]["shape_assumed"] is False and data["model"]["assumed"] == [
        "reward.model_checkpoint"
    ]


def test_the_critics_own_recompute_and_micro_batch(ppo):
    _, inp, lay = ppo
    base = trainer_memory(inp, lay)["by_model"]["critic"]["activations"]
    full = dataclasses.replace(inp, critic=dataclasses.replace(inp.critic, recompute="full"))
    m = trainer_memory(full, lay)
    # The critic alone recomputes: its activations are those of the policy's shape at full recompute.
    assert m["by_model"]["critic"]["activations"] == pytest.approx(
        trainer_memory(inp, lay, "full")["activations"]
    )
    assert m["by_model"]["policy"]["activations"] == pytest.approx(base)  # the policy stays selective
    assert critic_flops(full, "full")["recompute_extra"] > critic_flops(inp, "selective")["recompute_extra"]
    two = dataclasses.replace(inp, critic=dataclasses.replace(inp.critic, micro_batch_size=2))
    # Two sequences a microbatch, as many in flight (1F1B keeps PP of them): twice the activations.
    assert trainer_memory(two, lay)["by_model"]["critic"]["activations"] == pytest.approx(2 * base)
