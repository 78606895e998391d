"""Mixture-of-experts recipes: the Qwen3-MoE keys read from config.json, what is refused (naming the
key), and the expert layout's rules (layout.ep / layout.etp) against the model and the trainer grid."""

from __future__ import annotations

import json

import pytest

from megatron_rl.check.recipe import check_recipe, refused
from megatron_rl.config.load import load_recipe
from megatron_rl.models.resolve import CheckpointConfigError, fields_from_config
from megatron_rl.models.spec import ModelSpec
from megatron_rl.models.tiny import hf_config
from megatron_rl.parallel.layout import ExpertCoord, ParallelLayout
from megatron_rl.parallel.rules import expert_problems
from tests.helpers.specs import QWEN3_MOE_TINY, QWEN3_TINY

MOE = ["model.family=qwen3_moe", "model.num_experts=4", "model.moe_ffn_hidden_size=64", "model.moe_topk=2"]
# The tiny CPU recipe is TP2; an MoE model there runs at TP1 (no sequence parallelism on CPU).
TP1 = ["layout.tp=1", "layout.dp=2", "optim.micro_batch_size=8"]


def _config(**changes) -> dict:
    cfg = hf_config(QWEN3_MOE_TINY).to_dict()
    cfg.update(changes)
    return cfg


def test_the_moe_keys_are_read_from_config_json_as_transformers_writes_it():
    fields = fields_from_config(_config())
    assert fields["family"] == "qwen3_moe"
    assert (fields["num_experts"], fields["moe_ffn_hidden_size"], fields["moe_topk"]) == (4, 64, 2)
    assert fields["moe_norm_topk_prob"] is True and fields["qk_norm"] is True
    # transformers 5 writes num_local_experts; a transformers-4 checkpoint says num_experts.
    cfg = _config()
    cfg["num_experts"] = cfg.pop("num_local_experts", None) or 4
    assert fields_from_config(cfg)["num_experts"] == 4


@pytest.mark.parametrize(
    "changes,words",
    [
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ({"mlp_only_layers": [0]}, "mlp_only_layers"),
        ({"shared_expert_intermediate_size": 128}, "shared expert"),
        ({"num_experts_per_tok": 8}, "exceeds num_experts"),
        ({"num_experts_per_tok": None}, "num_experts_per_tok"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
    ],
)
def test_a_checkpoint_the_trainer_cannot_build_is_refused_naming_the_key(changes, words):
    cfg = _config(**changes)
    if changes.get("num_experts_per_tok", 1) is None:
        cfg.pop("num_experts_per_tok")
    with pytest.raises(CheckpointConfigError, match=words):
        fields_from_config(cfg)


def test_param_counts_total_and_active():
    s = QWEN3_MOE_TINY
    expert = 3 * s.hidden_size * s.moe_ffn_hidden_size
    assert s.expert_params() == expert
    router = s.num_experts * s.hidden_size
    assert s.layer_params() - s.layer_params(active=True) == (s.num_experts - s.moe_topk) * expert
    assert s.mlp_params(active=True) == router + s.moe_topk * expert
    # A dense model's counts do not change with `active`.
    assert QWEN3_TINY.num_params() == QWEN3_TINY.num_params(active=True)


def test_a_moe_recipe_without_a_checkpoint_validates_and_states_its_experts():
    recipe = load_recipe("grpo_tiny_cpu", [*MOE, *TP1, "layout.ep=2"])
    assert [p for p in check_recipe(recipe) if p.kind != "files"] == []
    spec = ModelSpec.from_config(recipe.model)
    assert spec.is_moe and spec.num_experts == 4
    assert not spec.moe_norm_topk_prob  # unstated: HF's Qwen3MoeConfig default (Qwen3-30B-A3B states true)


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["model.family=qwen3_moe"], "model.num_experts"),  # experts not stated
        ([*MOE[:1], "model.num_experts=4", "model.moe_topk=2"], "model.moe_ffn_hidden_size"),
        (["model.num_experts=4"], "model.num_experts"),  # experts on a dense family
        ([*MOE, "model.moe_topk=0"], "model.moe_topk"),
        ([*MOE, "model.moe_aux_loss_coeff=-1"], "model.moe_aux_loss_coeff"),
        ([*MOE, "model.moe_topk=5"], "model.moe_topk"),  # more than the 4 experts
        ([*MOE, *TP1, "model.moe_topk=1", "model.moe_norm_topk_prob=true"], "model.moe_norm_topk_prob"),
        ([*MOE, *TP1, "layout.ep=3"], "layout.ep"),  # 3 does not divide 4 experts
        ([*TP1, "layout.ep=2"], "layout.ep"),  # a dense model
        ([*TP1, "layout.etp=2"], "layout.etp"),
        ([*MOE, *TP1, "layout.etp=3"], "layout.etp"),  # 3 does not divide the experts' FFN (64)
        ([*MOE, "layout.ep=2"], "layout.sequence_parallel"),  # TP2 without sequence parallelism
        ([*MOE, "layout.sequence_parallel=true"], "layout.sequence_parallel"),  # none on the CPU build
        (["algorithm.routing_replay=true"], "algorithm.routing_replay"),  # a dense model has no experts
        ([*MOE, *TP1, "layout.engine_ep=true"], "layout.engine_ep"),  # expert-parallel engines: GPU only
        (["layout.engine_ep=true"], "layout.engine_ep"),  # a dense model
        (
            [*MOE, *TP1, "layout.engine_tp=2", "layout.engine_count=1"],
            "layout.engine_tp",
        ),  # CPU: whole experts
        (
            [
                *MOE,
                *TP1,
                "algorithm.routing_replay=true",
                "layout.pp=2",
                "layout.dp=1",
                "layout.recompute=full",
            ],
            "algorithm.routing_replay",
        ),
        (
            [
                *MOE,
                *TP1,
                "algorithm.routing_replay=true",
                "rollout.partial=true",
                "rollout.oversample=1.5",
                "algorithm.truncated_is_cap=2",
            ],
            "algorithm.routing_replay",
        ),
    ],
)
def test_wrong_moe_settings_are_refused_by_validate_naming_the_key(overrides, key):
    problems = check_recipe(load_recipe("grpo_tiny_cpu", overrides))
    mine = [p for p in problems if p.key == key]
    assert mine and refused(mine, "validate"), problems


def test_expert_grid_rules_name_the_fix():
    moe = QWEN3_MOE_TINY
    ok = ParallelLayout(tp=1, dp=4, ep=2, etp=2)
    assert expert_problems(ok, moe) == []
    # EP x ETP must divide the ranks of a stage (tp x cp x dp).
    [p] = expert_problems(ParallelLayout(tp=1, dp=2, ep=4, etp=1), moe)
    assert p.key == "layout.ep" and "must divide the tp x cp x dp = 2" in p.message
    # TP > 1 needs sequence parallelism for an MoE model (megatron-core refuses to train without it).
    [p] = expert_problems(ParallelLayout(tp=2, dp=2, ep=2), moe)
    assert p.key == "layout.sequence_parallel"
    assert expert_problems(ParallelLayout(tp=2, dp=2, ep=2, sequence_parallel=True), moe) == []


def test_expert_coordinates_follow_megatrons_expert_grid():
    # 8 ranks, TP2 x DP4 (one stage); expert grid ETP2 x EP2 x expert-DP2, order tp-cp-ep-dp-pp.
    lay = ParallelLayout(tp=2, dp=4, ep=2, etp=2)
    assert lay.expert_dp == 2
    assert [lay.expert_coord(r) for r in (0, 1, 2, 3, 4)] == [
        ExpertCoord(0, 0, 0, 0),
        ExpertCoord(1, 0, 0, 0),
        ExpertCoord(0, 1, 0, 0),
        ExpertCoord(1, 1, 0, 0),
        ExpertCoord(0, 0, 1, 0),
    ]
    # With PP, the stage index is the same as the dense grid's.
    pp = ParallelLayout(tp=1, pp=2, dp=2, ep=2)
    assert all(pp.expert_coord(r).pp == pp.trainer_coord(r).pp for r in range(4))


def test_a_moe_checkpoint_fills_the_recipe(tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_config()))
    unset = [f"model.{k}=null" for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                          "num_query_groups", "vocab_size", "qkv_bias", "max_position_embeddings",
                                          "rope_theta", "norm_eps", "tie_word_embeddings")]  # fmt: skip
    recipe = load_recipe("grpo_tiny_cpu", [*unset, *TP1, "model.family=null", f"model.hf_checkpoint={d}"])
    spec = ModelSpec.from_config(recipe.model)
    assert (spec.family, spec.num_experts, spec.moe_topk, spec.moe_ffn_hidden_size) == ("qwen3_moe", 4, 2, 64)
    # A recipe that states other experts than the checkpoint is refused, naming the key.
    recipe = load_recipe(
        "grpo_tiny_cpu", [*unset, "model.family=null", "model.num_experts=8", f"model.hf_checkpoint={d}"]
    )
    problems = [p for p in check_recipe(recipe) if p.key == "model.num_experts"]
    assert problems and "config.json says" in problems[0].message


def test_expert_parallel_engines_need_experts_the_engine_tp_divides():
    from megatron_rl.parallel.rules import engine_problems

    assert engine_problems(2, QWEN3_MOE_TINY, engine_ep=True) == []
    for tp in (3, 8):  # neither divides the 4 experts (nor the heads; each rule is named)
        problems = engine_problems(tp, QWEN3_MOE_TINY, engine_ep=True)
        assert any("must divide model.num_experts=4 with layout.engine_ep" in p.message for p in problems)
    # Without expert parallelism it is the experts' FFN width (64) that engine TP must divide.
    assert not any("num_experts" in p.message for p in engine_problems(8, QWEN3_MOE_TINY))
