"""Building the step's collaborators from a recipe: engine, task, reward pool, publisher.

Each builder knows one component; `train.py` calls them in order and never sees their options.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from megatron_rl.models.spec import ModelSpec
from megatron_rl.rollout.delivery import delivery_for

log = logging.getLogger(__name__)

_ENGINE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def build_engine(cfg, run):
    """This rank's part of a colocated vLLM engine (its place among the engines: `engine_role`)."""
    from megatron_rl.models.tiny import hf_config
    from megatron_rl.rollout.vllm_engine import VLLMEngine

    lay = cfg.layout
    if lay.placement != "colocated":
        raise SystemExit(
            "layout.placement=separated is modelled by `megatron-rl plan` but the driver runs colocated "
            "engines only for now; set layout.placement=colocated"
        )
    spec = ModelSpec.from_config(cfg.model)
    model_dir = run.dir.parent / f".{run.name}-engine-config"
    if run.is_main:
        # The engine starts from a config alone (dummy weights); version 0 is published before it serves.
        model_dir.mkdir(parents=True, exist_ok=True)
        hf_config(spec, _ENGINE_DTYPES[spec.params_dtype]).save_pretrained(model_dir)
    dist.barrier()
    engine = VLLMEngine(
        cfg.rollout,
        model_dir,
        tp=lay.engine_tp,
        seed=cfg.rollout.seed,
        engine_index=engine_role(run)[0],
        dtype=_ENGINE_DTYPES[spec.params_dtype],
        max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
    )
    return engine


def engine_role(run) -> tuple[int, bool]:
    """(engine_index, is_leader): which engine this rank belongs to, and whether it is its first TP rank."""
    coord = run.layout.engine_coord(run.rank)
    if coord is None:  # separated placement: refused by check() before anything is built
        raise RuntimeError(f"rank {run.rank} holds no engine in {run.layout.describe()}")
    return coord.engine, coord.is_leader


def build_task(cfg):
    """Prompts and their reward problems."""
    if cfg.data.source == "synthetic":
        from megatron_rl.data.synthetic import ArithmeticTask

        return ArithmeticTask(seed=cfg.data.seed)
    from megatron_rl.data.task import ProblemTask

    return ProblemTask.from_config(cfg)


def build_reward_pool(cfg, is_leader: bool):
    """A share of the reward pool on each engine leader (the only ranks that submit samples)."""
    from megatron_rl.reward.pool import RewardPool

    if not is_leader:
        return None
    share = max(1, cfg.reward.workers // cfg.layout.engine_count)
    from dataclasses import replace

    return RewardPool(replace(cfg.reward, workers=share))


def build_publisher(cfg, run, engine):
    """Reshard trainer shards into the engine's layout; the vLLM sink validates before activating."""
    from megatron_rl.reshard.plan import Links
    from megatron_rl.reshard.publish import Publisher
    from megatron_rl.rollout.sink import VLLMEngineSink

    layout = run.layout
    spec = ModelSpec.from_config(cfg.model)
    links = Links.from_cluster(cfg.cluster)
    delivery = delivery_for(engine.on_gpu)
    return Publisher(
        layout,
        spec,
        sink=VLLMEngineSink(engine, delivery=delivery),
        delivery=delivery,
        links=links,
    )


def trainer_temperature(ro) -> float:
    """The temperature the trainer's log-probs use, so they follow the engine's saved convention."""
    from megatron_rl.rollout.sampling import needs_full_vocab
    from megatron_rl.rollout.sampling import trainer_temperature as tt

    if needs_full_vocab(ro.logprobs_mode, ro.top_p, ro.top_k):
        raise SystemExit(
            f"rollout.top_p={ro.top_p} / top_k={ro.top_k} with logprobs_mode={ro.logprobs_mode} need the "
            "trainer's log-probs renormalised over the sampler's support, which the vocab-parallel trainer "
            "does not compute yet; use top_p=1 and top_k=-1, or logprobs_mode=raw_logprobs"
        )
    return tt(ro.logprobs_mode, ro.temperature)


def build_checkpointer(cfg, run):
    from pathlib import Path

    from megatron_rl.checkpoint.save import Checkpointer

    c = cfg.checkpoint
    return Checkpointer(Path(c.dir) / run.name, run, c.keep_last, c.keep_every, c.async_save)


def resume(cfg, run, policy, reference, task) -> int:
    """The step to start from: 0, or that of the checkpoint `checkpoint.resume` selects (auto: the newest
    that verifies). Every rank takes part: verifying re-hashes a share of the files on each."""
    from pathlib import Path

    from megatron_rl.checkpoint.resume import find, load

    path = find(cfg.checkpoint.resume, Path(cfg.checkpoint.dir) / run.name)
    box = [str(path) if path else None]
    dist.broadcast_object_list(box, src=0)  # every rank loads the same checkpoint
    if box[0] is None:
        return 0
    state = load(Path(box[0]), run, policy, reference, task)
    run.say(f"resumed from {box[0]} at step {state['step']}")
    return int(state["step"])


def run_state(cfg, run, task, step: int) -> dict:
    return {
        "step": step,
        "version": step,  # samples of step s (0-based) are drawn with version s
        "task": task.state(),
        "world_size": dist.get_world_size(),
        "layout": run.layout.sizes(),
        "seed": cfg.seed,
        "kl_coef": cfg.algorithm.kl_coef,
        "reward_pending": 0,  # saves happen at step boundaries, with the reward pool idle
    }


def checkpoint_interval(cfg) -> int:
    """Steps between saves: the recipe's, or with checkpoint.interval=-1 the planner's Young/Daly figure
    (from the predicted step time, the checkpoint's write cost and the cluster's node failure rate)."""
    if cfg.checkpoint.interval != -1:
        return cfg.checkpoint.interval
    from megatron_rl.plan.cycle import cycle
    from megatron_rl.plan.inputs import inputs_from_recipe, layout_from_recipe
    from megatron_rl.plan.reliability import reliability

    inp, lay = inputs_from_recipe(cfg), layout_from_recipe(cfg)
    steps = reliability(inp, lay, cycle(inp, lay).step_s)["interval_steps_optimal"]
    log.info("checkpoint interval from the planner's Young/Daly figure: every %d step(s)", steps)
    return int(steps)


def save_due(interval: int, steps: int, step: int, preempted: bool) -> bool:
    return preempted or (interval > 0 and (step % interval == 0 or step == steps))
