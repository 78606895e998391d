"""The one place a recipe becomes a run's settings.

Each of these was decided by its consumers (the layout read in eight places, the model's spec in six,
delivery and sleep level in four, the checkpoint's end ids in three): here each is decided once, from
the recipe the check has passed (check/recipe.py builds the Run as it checks; `validate_recipe`
returns it), and the Run is frozen. What it decides:

    layout       ParallelLayout.from_config(recipe.layout)
    spec         the model group resolved from its checkpoint's config.json (models/resolve.py)
    stop ids     the checkpoint's end ids (generation config and tokenizer), None when it is unreadable
                 here (the driver refuses that before it builds anything)
    sampling     the recipe's sampling with those end ids
    on_gpu       the cluster's: `cluster.gpu` other than cpu (the driver refuses a GPU cluster where CUDA
                 does not come up: system/device.py)
    delivery     in place on GPU, through vLLM's loader on the CPU build (rollout/delivery.py)
    sleep_level  the recipe's, or the one the delivery calls for
    staleness    k: the steps the engines may run ahead (separated and asynchronous only)
    thresholds   the engine-vs-trainer agreement's, set by the dtypes (rollout/agreement.py)
    probe        the log-prob probe's (sequences, tokens each)
    critic_spec  PPO's value model (algorithm.name=ppo): the policy's spec when critic.init=policy, else the
                 spec of the reward model it starts from; None for GRPO
    reward_spec  the learned reward model's (reward.model_checkpoint); None without one
    assumed      which of those two shapes could not be read here (their config.json absent: a plan made
                 before the checkpoints are copied) and were taken to be the policy's
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from megatron_rl.models.resolve import resolve_model
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.parallel.schedule import staleness
from megatron_rl.rollout.agreement import Thresholds, probe_shape, thresholds_of
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for
from megatron_rl.rollout.types import SamplingSettings


@dataclass(frozen=True)
class Run:
    recipe: object  # config.schema.RecipeConfig, its model group resolved from the checkpoint
    layout: ParallelLayout
    spec: ModelSpec
    checkpoint_stop_ids: tuple[int, ...] | None
    sampling: SamplingSettings | None  # None only in a run the check refuses (its convention)
    on_gpu: bool
    delivery: str
    sleep_level: int
    staleness: int
    thresholds: Thresholds | None  # None only in a run the check refuses (no floor for its dtypes)
    probe: tuple[int, int]
    critic_spec: ModelSpec | None = None
    reward_spec: ModelSpec | None = None
    assumed: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.recipe.name


def resolve(recipe) -> Run:
    """The Run of a recipe whose numbers and names the check has passed (otherwise this may raise)."""
    recipe = replace(recipe, model=resolve_model(recipe.model))
    ro, on_gpu = recipe.rollout, recipe.cluster.gpu != "cpu"
    ids = checkpoint_stop_ids(recipe.model.hf_checkpoint)
    delivery, layout = delivery_for(on_gpu), ParallelLayout.from_config(recipe.layout)
    spec = ModelSpec.from_config(recipe.model)
    assumed: list[str] = []
    critic_spec = reward_spec = None
    if recipe.algorithm.name == "ppo":
        init = recipe.critic.init
        critic_spec = spec if init == "policy" else side_model_spec(recipe, init, "critic.init", assumed)
    if recipe.reward.model_checkpoint:
        reward_spec = side_model_spec(
            recipe, recipe.reward.model_checkpoint, "reward.model_checkpoint", assumed
        )
    return Run(
        recipe=recipe,
        layout=layout,
        spec=spec,
        checkpoint_stop_ids=ids,
        sampling=_sampling(ro, ids),
        on_gpu=on_gpu,
        delivery=delivery,
        sleep_level=sleep_level_for(ro.sleep_level, delivery),
        staleness=staleness(layout, ro),
        thresholds=_thresholds(recipe),
        probe=probe_shape(recipe),
        critic_spec=critic_spec,
        reward_spec=reward_spec,
        assumed=tuple(assumed),
    )


def side_model_spec(recipe, hf_dir: str, key: str, assumed: list[str]) -> ModelSpec:
    """The spec of a model beside the policy (a reward model, a critic started from one): read from its
    config.json at the policy's dtype; the policy's own shape when it cannot be read here (`key` is then
    added to `assumed`, and the plan says so). The check refuses a config.json that is there but wrong."""
    from megatron_rl.models.resolve import CheckpointConfigError, read_config

    try:
        readable = read_config(hf_dir) is not None
    except CheckpointConfigError:
        readable = False
    if not readable:
        assumed.append(key)
        return ModelSpec.from_config(recipe.model)
    side = replace(recipe.model, **{k: None for k in SHAPE_KEYS}, hf_checkpoint=hf_dir, name="", fixture="")
    try:
        return ModelSpec.from_config(resolve_model(side))
    except (ValueError, TypeError, KeyError):
        assumed.append(key)
        return ModelSpec.from_config(recipe.model)


# The model keys a side model takes from its own config.json, not from the policy's recipe group.
SHAPE_KEYS = (
    "family", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "head_dim", "vocab_size", "max_position_embeddings", "rope_theta", "norm_eps", "qkv_bias", "qk_norm",
    "tie_word_embeddings", "rope_scaling", "rope_scaling_factor", "rope_low_freq_factor",
    "rope_high_freq_factor", "rope_original_max_position", "num_experts", "moe_ffn_hidden_size", "moe_topk",
    "moe_norm_topk_prob",
)  # fmt: skip


def _sampling(ro, ids) -> SamplingSettings | None:
    try:
        return SamplingSettings.from_config(ro, ids or ())
    except ValueError:  # a sampling convention the trainer cannot follow: the check says so
        return None


def _thresholds(recipe) -> Thresholds | None:
    try:
        return thresholds_of(recipe)
    except KeyError:  # a dtype pair without a measured floor and without the recipe's own: the check says so
        return None


def checkpoint_stop_ids(hf_checkpoint: str) -> tuple[int, ...] | None:
    """The checkpoint's end ids (models/checkpoint.py); () without a checkpoint, None when it cannot be
    read here (the recipe check says why)."""
    if not hf_checkpoint:
        return ()
    from megatron_rl.models.checkpoint import stop_token_ids

    try:
        return tuple(stop_token_ids(hf_checkpoint))
    except (OSError, ValueError, TypeError, KeyError):  # absent, unreadable or malformed files here
        return None
