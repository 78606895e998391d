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

    @property
    def name(self) -> str:
        return self.recipe.name


def resolve(recipe) -> Run:
    """The Run of a recipe whose numbers and names the check has passed (otherwise this may raise)."""
    recipe = replace(recipe, model=resolve_model(recipe.model))
    ro, on_gpu = recipe.rollout, recipe.cluster.gpu != "cpu"
    ids = checkpoint_stop_ids(recipe.model.hf_checkpoint)
    delivery, layout = delivery_for(on_gpu), ParallelLayout.from_config(recipe.layout)
    return Run(
        recipe=recipe,
        layout=layout,
        spec=ModelSpec.from_config(recipe.model),
        checkpoint_stop_ids=ids,
        sampling=_sampling(ro, ids),
        on_gpu=on_gpu,
        delivery=delivery,
        sleep_level=sleep_level_for(ro.sleep_level, delivery),
        staleness=staleness(layout, ro),
        thresholds=_thresholds(recipe),
        probe=probe_shape(recipe),
    )


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
