"""Building the step's collaborators from the resolved run: engine, task, reward pool, publisher, probe.

Each builder knows one component; `train.py` calls them in order and never sees their options. Every
one reads the run resolved once by the recipe check (run/resolve.py: its layout, the model's spec,
the sampling settings with their end ids, the delivery and sleep level, the thresholds): none decides
any of those again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from megatron_rl.models.dtypes import hf_dtype_name

if TYPE_CHECKING:
    from megatron_rl.loop.placement.processes import Processes
    from megatron_rl.loop.record.records import RunLog
    from megatron_rl.run import Run

log = logging.getLogger(__name__)


def build_engine(run: Run, procs: Processes, run_dir: Path):
    """This rank's part of a vLLM engine (its place among the engines: `engine_role`), colocated with a
    trainer rank or on an engine rank of a separated job; its config goes next to the run directory.

    Collective over the default world: every rank when colocated, the engine pool when separated (vLLM
    builds its groups from the default world, and there it must see the pool's ranks:
    loop/placement/pools.py)."""
    from megatron_rl.models.tiny import hf_config
    from megatron_rl.rollout.agreement import dtypes_of
    from megatron_rl.rollout.vllm_engine import VLLMEngine

    cfg, lay, spec = run.recipe, run.layout, run.spec
    model_dir = run_dir.parent / f".{run_dir.name}-engine-config"
    if procs.rank == lay.engine_ranks(0)[0]:
        # The engine starts from a config alone (dummy weights); version 0 is published before it serves.
        model_dir.mkdir(parents=True, exist_ok=True)
        hf_config(spec, hf_dtype_name(spec.params_dtype)).save_pretrained(model_dir)
    dist.barrier()
    return VLLMEngine(
        cfg.rollout,
        model_dir,
        tp=lay.engine_tp,
        seed=cfg.rollout.seed,
        engine_index=engine_role(procs)[0],
        dtype=hf_dtype_name(dtypes_of(cfg)[1]),  # rollout.dtype, else the trainer's
        max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
        sampling=run.sampling,  # with the checkpoint's end ids: the engine's folder holds config.json alone
        sleep_level=run.sleep_level,
        record_routes=cfg.algorithm.routing_replay,
        expert_parallel=lay.engine_ep,
    )


def engine_role(procs: Processes) -> tuple[int, bool]:
    """(engine_index, is_leader): which engine this rank belongs to, and whether it is its first TP rank."""
    coord = procs.layout.engine_coord(procs.rank)
    if coord is None:  # a separated job's trainer rank
        raise RuntimeError(f"rank {procs.rank} holds no engine in {procs.layout.describe()}")
    return coord.engine, coord.is_leader


def read_problems(run: Run, procs: Processes) -> list | None:
    """The problem set, read once for the job: job rank 0 reads data.source and sends it to every rank
    (None for the synthetic task, which reads nothing), so a thousand ranks do not read the same files
    at once. Collective over the job: every rank calls it at the same point. A read that fails on rank 0
    fails on every rank with rank 0's message, so none waits for data that is not coming."""
    if run.recipe.data.source == "synthetic":
        return None
    import torch.distributed as dist

    box: list = [None]
    error = None
    if procs.rank == 0:
        from megatron_rl.data.problems import load_problems

        d = run.recipe.data
        try:
            box = [load_problems(d.source, d.columns)]
        except Exception as e:  # any: the other ranks are waiting in the broadcast below
            error, box = e, [f"{type(e).__name__}: {e}"]
    dist.broadcast_object_list(box, src=0, group=procs.job_cpu_group)
    if error is not None:
        raise error
    if isinstance(box[0], str):
        raise RuntimeError(f"data.source={run.recipe.data.source!r}: job rank 0 could not read it: {box[0]}")
    return box[0]


def build_task(run: Run, problems: list | None = None):
    """Prompts and their reward problems (`problems`: the set `read_problems` shared; read here if None)."""
    cfg = run.recipe
    if cfg.data.source == "synthetic":
        from megatron_rl.data.synthetic import ArithmeticTask

        d = cfg.data
        return ArithmeticTask(
            seed=d.seed,
            tail_share=d.tail_share,
            short_answer_tokens=d.short_answer_tokens,
            hidden_target=d.hidden_target,
        )
    from megatron_rl.data.task import ProblemTask

    return ProblemTask.from_config(cfg, problems=problems)


def build_reward_pool(run: Run, is_leader: bool, task=None):
    """A share of the reward pool on each engine leader (the only ranks that submit samples). With
    `rollout.env`, wrapped in the turn scheduler that drives each trajectory's turns and grades them
    through its environment (rollout/turns.py), on `task`'s problems and tokenizer."""
    from dataclasses import replace

    from megatron_rl.reward.pool import RewardPool

    if not is_leader:
        return None
    reward = run.recipe.reward
    pool = RewardPool(replace(reward, workers=max(1, reward.workers // run.layout.engine_count)))
    if not run.recipe.rollout.env:
        return pool
    return build_turns(run, task, pool)


def build_turns(run: Run, task, pool):
    """The engine leader's turn scheduler: the recipe's environment on the reward pool, observations
    rendered through the task's chat template (or its own encoding), a thread per concurrent episode."""
    from megatron_rl.env.render import ChatRenderer, PlainRenderer
    from megatron_rl.env.resolve import environment_class
    from megatron_rl.env.types import EnvContext
    from megatron_rl.rollout.turns import TurnScheduler, TurnSettings

    ro = run.recipe.rollout
    cls = environment_class(ro.env)
    try:
        env = cls(EnvContext(pool, task, ro.max_turns))
    except Exception as e:
        pool.close()
        raise RuntimeError(
            f"rollout.env={ro.env!r}: {cls.__name__}(EnvContext) raised {type(e).__name__}: {e}"
        ) from e
    tok = task.tok
    if getattr(tok, "chat_template", None):
        renderer = ChatRenderer(tok, run.sampling.stop_token_ids)
    elif hasattr(tok, "vocab_size") and not hasattr(tok, "apply_chat_template"):  # the task's own characters
        renderer = PlainRenderer(tok.encode)
    else:
        renderer = PlainRenderer(lambda text: tok.encode(text, add_special_tokens=False))
    settings = TurnSettings(ro.max_turns, ro.turn_max_tokens, ro.observation_max_tokens, ro.env_timeout_s)
    # Episodes mostly wait on their sandbox: a few threads per sandbox keep every sandbox busy.
    groups = run.recipe.data.prompts_per_step * ro.samples_per_prompt // run.layout.engine_count
    return TurnScheduler(
        pool, env, task, renderer, settings, workers=min(max(4, 2 * pool.workers), max(groups, 1))
    )


def build_publisher(run: Run, procs: Processes, engine):
    """Reshard trainer shards into the engine's layout; the vLLM sink validates before activating.
    `engine` None: a separated job's trainer rank (it sends, holds no sink). Over the job group (the
    default group when colocated; loop/placement/pools.py when separated) and its gloo twin for host
    objects. When a disagreeing probe refuses a version, the sink keeps the one it replaces until the
    probe's verdict (rollout/sink.py `keep_previous`)."""
    from megatron_rl.reshard.plan import Links
    from megatron_rl.reshard.publish import Publisher
    from megatron_rl.rollout.sink import VLLMEngineSink

    keep = probing(run) and run.recipe.rollout.on_logprob_disagreement == "refuse"
    sink = VLLMEngineSink(engine, delivery=run.delivery, keep_previous=keep) if engine is not None else None
    return Publisher(
        run.layout,
        run.spec,
        sink=sink,
        delivery=run.delivery,
        links=Links.from_cluster(run.recipe.cluster),
        group=procs.job_group,
        cpu_group=procs.job_cpu_group,
    )


def build_refusals(run: Run, publisher):
    """What a refused or disagreeing publication does (loop/placement/publication.py), with the agreement
    thresholds the recipe's dtypes set (rollout/agreement.py)."""
    from megatron_rl.loop.placement.publication import RefusalPolicy

    ro = run.recipe.rollout
    return RefusalPolicy(
        publisher,
        ro.on_refused_publication,
        ro.max_refused_publications,
        ro.on_logprob_disagreement,
        run.thresholds,
    )


def probing(run: Run) -> bool:
    return run.probe[0] > 0


def build_prober(run: Run, procs: Processes, timer, policy=None, engine=None):
    """The log-prob probe of every publication (loop/placement/probe.py), or None with
    rollout.logprob_probe_prompts=0. `policy`: on trainer ranks; `engine`: on ranks that hold part of an
    engine."""
    if not probing(run):
        return None
    from megatron_rl.loop.placement.probe import Prober, probe_sequences

    index, leader = engine_role(procs) if engine is not None else (-1, False)
    count, length = run.probe
    return Prober(
        probe_sequences(run.spec.vocab_size, count, length, run.recipe.seed),
        run.thresholds,
        procs.job_cpu_group,
        engine=engine,
        engine_index=index,
        is_leader=leader,
        policy=policy,
        timer=timer,
    )


def build_colocated(
    run: Run, procs: Processes, log_: RunLog, policy, reference, critic=None, problems: list | None = None
):
    """This rank's engine side when colocated (loop/placement/colocated.py): the engine, built with the
    trainer (and PPO's critic) aside and asleep before they come back, its place among the engines, and its
    share of the reward pool. None when separated (the trainer ranks hold no engine). `problems`: the
    shared problem set (`read_problems`), which a multi-turn environment reads."""
    if not run.layout.colocated:
        return None
    from functools import partial

    from megatron_rl.loop.placement.colocated import EngineSide
    from megatron_rl.loop.placement.timeshare import TimeShare

    # The engine claims its share of the device at construction: the trainer steps aside until it sleeps.
    also = [(critic.optimizer, critic.ddp)] if critic is not None else []
    timeshare = TimeShare.start(
        partial(build_engine, run, procs, log_.dir),
        policy.optimizer,
        policy.ddp,
        reference,
        log_.note_memory,
        also,
    )
    index, leader = engine_role(procs)
    # with rollout.env, the engine leader's own task: its environment reads problems and the tokenizer
    task = build_task(run, problems) if leader and run.recipe.rollout.env else None
    return EngineSide(timeshare, timeshare.engine, index, leader, build_reward_pool(run, leader, task))


def build_feed(
    run: Run, procs: Processes, log_: RunLog, policy, task, refusals, start, carried, prober, side
):
    """The trainer's side of rollout the layout calls for (loop/placement/feed.py): colocated with `side`
    (`build_colocated`), or separated."""
    if side is not None:
        from megatron_rl.loop.placement.colocated import ColocatedFeed

        return ColocatedFeed(run, procs, log_, policy, task, refusals, start, carried, prober, side)
    from megatron_rl.loop.placement.separated import SeparatedFeed

    return SeparatedFeed(run, procs, log_, policy, task, refusals, start, carried, prober)


def trainer_temperature(ro) -> float:
    """The temperature the trainer's log-probs use, so they follow the engine's saved convention
    (a truncated support was refused by the recipe check: rollout/convention.py)."""
    from megatron_rl.rollout.convention import trainer_temperature as tt

    return tt(ro.logprobs_mode, ro.temperature)


def build_checkpointer(run: Run, procs: Processes, name: str):
    """Saves of run `name` under `checkpoint.dir`; the processes agree on each save over their gloo group."""
    from megatron_rl.checkpoint.save import Checkpointer

    c = run.recipe.checkpoint
    return Checkpointer(Path(c.dir) / name, procs, c.keep_last, c.keep_every, c.async_save)


def resume(
    run: Run, procs: Processes, log_: RunLog, policy, reference, task, critic=None
) -> tuple[int, dict | None]:
    """The step to start from: 0, or that of the checkpoint `checkpoint.resume` selects (auto: the newest
    that verifies), and the groups it carried (rollout.partial: loop/step/carry.py records). Every rank
    takes part: verifying re-hashes a share of the files on each."""
    from megatron_rl.checkpoint.resume import find, load

    c = run.recipe.checkpoint
    path = find(c.resume, Path(c.dir) / log_.name, procs.cpu_group)
    box = [str(path) if path else None]
    dist.broadcast_object_list(box, src=0, group=procs.cpu_group)  # every rank loads the same checkpoint
    if box[0] is None:
        return 0, None
    t0 = time.perf_counter()
    state = load(Path(box[0]), procs.rank, policy, reference, task, critic)
    load_s = time.perf_counter() - t0
    log_.resumed(state.get("records"))  # its W&B run, continued when the checkpoint is this run's own
    # A rerun under the same name lands here (checkpoint.resume=auto): say so, and how not to.
    again = (
        " (a run of the same name; another MEGATRON_RL_RUN_NAME starts afresh)" if c.resume == "auto" else ""
    )
    log_.say(f"resumed from {box[0]} at step {state['step']} (loaded in {load_s:.2f} s){again}")
    return int(state["step"]), state.get("carry")


def run_state(
    run: Run, task_state: dict, step: int, carry: list[dict] | None = None, records: dict | None = None
) -> dict:
    """What a checkpoint after `step` steps keeps besides the weights. `task_state`: the task's position
    before the batch of `step` was drawn (loop/placement/feed.py: engines that run ahead have drawn
    further); `carry`: the groups carried into that batch and their settings (rollout.partial);
    `records`: the run's name and W&B run (loop/record/records.py `identity`), which a resume continues."""
    return {
        "records": records,
        "step": step,
        "version": step,  # samples of step s (0-based) are drawn with version s
        "task": task_state,
        "carry": carry,
        "world_size": dist.get_world_size(),
        "layout": run.layout.sizes(),
        "seed": run.recipe.seed,
        "kl_coef": run.recipe.algorithm.kl_coef,
        "algorithm": run.recipe.algorithm.name,
        "critic": run.recipe.algorithm.name
        == "ppo",  # the checkpoint holds the critic (checkpoint/resume.py)
        "reward_pending": 0,  # saves happen at step boundaries, with the reward pool idle
    }


def checkpoint_interval(run: Run) -> int:
    """Steps between saves: the recipe's, or with checkpoint.interval=-1 the planner's Young/Daly figure
    (from the predicted step time, the checkpoint's write cost and the cluster's node failure rate)."""
    if run.recipe.checkpoint.interval != -1:
        return run.recipe.checkpoint.interval
    from megatron_rl.plan.cycle import cycle
    from megatron_rl.plan.inputs import inputs_from_run
    from megatron_rl.plan.reliability import reliability

    inp, lay = inputs_from_run(run), run.layout
    steps = reliability(inp, lay, cycle(inp, lay).step_s)["interval_steps_optimal"]
    log.info(
        "checkpoint interval from the planner's Young/Daly figure: every %s",
        "step" if steps == 1 else f"{steps} steps",
    )
    return int(steps)


def save_due(interval: int, steps: int, step: int, preempted: bool) -> bool:
    return preempted or (interval > 0 and (step % interval == 0 or step == steps))
