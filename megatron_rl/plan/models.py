"""The models on the trainer's GPUs, each counted by its own shape: policy, reference, critic, reward model.

    policy        the trained language model: GPT body + vocabulary-sized output layer ("lm" head)
    reference     a frozen copy of the policy (KL): the policy's shape, weights only
    critic        PPO's value model (algorithm.name=ppo): a GPT body of its own spec (the policy's with
                  critic.init=policy, else the reward model it starts from) with a one-output value head,
                  no vocabulary-sized output layer ("value" head); trained: params, grads, optimizer,
                  activations, like the policy
    reward model  a learned reward (reward.model_checkpoint, an HF *ForSequenceClassification): a GPT body
                  with a one-label score head ("score" head); frozen, weights only

Every model runs at the trainer's layout (TP x PP x DP x CP), so each GPU holds stage i of every model,
except a critic at its own TP x PP (critic.tp, critic.pp; DP the rest: `critic_layout`), counted at that
layout, its heaviest stage on every GPU when its PP is not the trainer's. Parameters
of a stage: its layers, the embedding on the first stage, the final norm and the head on the last
(the lm head is the padded vocabulary x hidden, or nothing extra when tied at PP 1; a value or score
head is hidden x 1). FLOPs follow the matmul parameters: every layer's and the head's (the
embedding is a lookup), so a critic forward is a policy forward without the 2 x vocab x hidden per
token of the output layer, plus 2 x hidden for the value head.

A side model whose layer count differs from the policy's is split evenly over the stages (an explicit
layout.pp_layers is the policy's split).
"""

from __future__ import annotations

import dataclasses

from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel import rules
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import PlanInputs

LM, VALUE, SCORE = "lm", "value", "score"
HEAD_OF = {"policy": LM, "reference": LM, "critic": VALUE, "reward_model": SCORE}
# The order the report lists them in (the JSON's `by_model` keys).
MODELS = ("policy", "critic", "reference", "reward_model")


def stage_split(spec: ModelSpec, layout: ParallelLayout) -> list[int]:
    """Layers per pipeline stage of a model of `spec` at `layout`."""
    if layout.pp_layers and sum(layout.pp_layers) != spec.num_layers:
        return rules.megatron_split(spec.num_layers, layout.pp)
    return layout.stage_layers(spec.num_layers)


def head_params(spec: ModelSpec, head: str) -> int:
    """Parameters of the output head alone (unpadded vocabulary for the lm head)."""
    if head == LM:
        return 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size
    return spec.hidden_size  # one output per token: hidden x 1, no bias (HF's score head)


def stage_params_of(spec: ModelSpec, layout: ParallelLayout, head: str = LM) -> list[int]:
    """Parameters of every pipeline stage of a model (whole, before TP): layers, plus the embedding on
    the first and the final norm and head on the last. The vocabulary is megatron's, padded to a multiple
    of make_vocab_size_divisible_by x TP; an lm head tied to the embedding is held twice once PP > 1."""
    rows = spec.padded_vocab(layout.tp) * spec.hidden_size
    split = stage_split(spec, layout)
    out = []
    for i, layers in enumerate(split):
        n = layers * spec.layer_params()
        if i == 0:
            n += rows
        if i == len(split) - 1:
            if head == LM:
                n += spec.hidden_size + (0 if (spec.tie_word_embeddings and len(split) == 1) else rows)
            else:
                n += spec.hidden_size + spec.hidden_size  # final norm + the one-output head
        out.append(n)
    return out


def matmul_params_of(spec: ModelSpec, head: str = LM) -> int:
    """Weights that take part in a matmul per token: every layer (a mixture of experts' router and top-k
    experts) and the output head; the lm head counts the vocabulary once even when tied."""
    out = spec.vocab_size * spec.hidden_size if head == LM else spec.hidden_size
    return spec.num_layers * spec.layer_params(active=True) + out


def all_params_of(spec: ModelSpec, head: str = LM) -> int:
    """All parameters of the model, unpadded vocabulary (the count a checkpoint of it holds)."""
    body = spec.num_layers * spec.layer_params() + spec.vocab_size * spec.hidden_size + spec.hidden_size
    return body + head_params(spec, head)


def critic_view(inp: PlanInputs) -> PlanInputs:
    """The inputs as the critic sees them: its spec and micro-batch size (the functions of memory.py and
    cycle.py that read `inp.spec` and `inp.work` then count the critic)."""
    assert inp.critic is not None
    work = dataclasses.replace(inp.work, micro_batch_size=inp.critic.micro_batch_size)
    return dataclasses.replace(inp, spec=inp.critic.spec, work=work)


def reward_view(inp: PlanInputs) -> PlanInputs:
    """The inputs as the reward model sees them: its spec, the policy's micro-batch size."""
    assert inp.reward_model is not None
    return dataclasses.replace(inp, spec=inp.reward_model)


def critic_recompute(inp: PlanInputs, layout_recompute: str) -> str:
    """The critic's activation recompute: critic.recompute, or the layout's when that is empty."""
    return (inp.critic.recompute if inp.critic is not None else "") or layout_recompute


def critic_layout(inp: PlanInputs, layout: ParallelLayout) -> ParallelLayout:
    """The critic's layout on the trainer's GPUs: its own TP x PP when set (ParallelLayout.for_model, as the
    driver builds it), with its recompute."""
    assert inp.critic is not None
    own = layout.for_model(inp.critic.tp, inp.critic.pp)
    return own.with_(recompute=critic_recompute(inp, layout.recompute))


def side_models(inp: PlanInputs) -> dict:
    """The models beside the policy, as the report's ModelSummary lists them (report_types.SideModel)."""
    out = {}
    if inp.critic is not None:
        out["critic"] = _side(inp.critic.spec, VALUE, "critic.init", inp.critic.init, inp.assumed)
    if inp.reward_model is not None:
        key = "reward.model_checkpoint"
        out["reward_model"] = _side(inp.reward_model, SCORE, key, inp.reward_checkpoint, inp.assumed)
    return out


def _side(spec: ModelSpec, head: str, key: str, source: str, assumed: tuple) -> dict:
    return {
        "key": key,
        "source": source,
        "params": all_params_of(spec, head),
        "matmul_params": matmul_params_of(spec, head),
        "layers": spec.num_layers,
        "hidden": spec.hidden_size,
        "head": head,
        "shape_assumed": key in assumed,
    }
