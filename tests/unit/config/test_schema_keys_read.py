"""Every key of the recipe schema is read by the code: none is accepted and then ignored.

The tiny recipe is loaded and each group dataclass (and the recipe itself) is given a subclass that
records which of its fields are read, and from where. Then the code that consumes a recipe without
processes or GPUs runs on it: the recipe check, the planner, the model spec, the optimizer settings,
the Slurm request, the task, the checkpoint interval. A read counts only when it comes from the
package itself and not from the recipe check (`check*.py`) or `config/schema.py`: a key that is only validated is still
ignored (`optim.warmup_steps` was: range-checked, read nowhere).

Keys read only on paths this test cannot run (the driver loop, the engine, the reward pool, the
process groups) are listed in READ_ELSEWHERE with the function that reads them; the test checks that
each function's source really reads that field. A selector whose only admitted value is the one
behaviour there is (`ENUMS` in check/ranges.py holds one value: any other is refused) needs no reader.
A new schema key that nothing reads fails here.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

import pytest

from megatron_rl.config.load import load_recipe
from megatron_rl.config.schema import GROUPS, RecipeConfig
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.run import resolve

PACKAGE = Path(importlib.import_module("megatron_rl").__file__).parent
NOT_EVIDENCE = {
    PACKAGE / "check/recipe.py",
    PACKAGE / "check/ranges.py",
    PACKAGE / "check/files.py",
    PACKAGE / "config" / "schema.py",
}

# key -> "module:function" that reads it, on a path that needs processes, an engine or a GPU.
READ_ELSEWHERE = {
    "model.fixture": "megatron_rl.cli.launch_local:ready_here",
    "algorithm.advantage_std_norm": "megatron_rl.loop.step.rl_batch:advantages_with_kl",
    "algorithm.clip_low": "megatron_rl.loop.step.rl_batch:grpo_loss_fn",
    "algorithm.clip_high": "megatron_rl.loop.step.rl_batch:grpo_loss_fn",
    "algorithm.kl_estimator": "megatron_rl.train:main",
    "algorithm.kl_in_reward": "megatron_rl.train:main",
    "algorithm.loss_agg": "megatron_rl.train:main",
    "algorithm.dynamic_sampling": "megatron_rl.loop.step.collect:collect_batch",
    "algorithm.max_resample_rounds": "megatron_rl.loop.step.collect:collect_batch",
    "algorithm.overlong": "megatron_rl.loop.step.rl_batch:shaped_rewards",
    "algorithm.overlong_penalty_tokens": "megatron_rl.loop.step.rl_batch:shaped_rewards",
    "algorithm.truncated_is_cap": "megatron_rl.loop.step.rl_batch:grpo_loss_fn",
    "algorithm.routing_replay": "megatron_rl.trainer.build:build_policy",
    "rollout.max_staleness": "megatron_rl.parallel.schedule:staleness",
    "rollout.oversample": "megatron_rl.loop.step.collect:collect_batch",
    "rollout.partial": "megatron_rl.loop.step.collect:collect_batch",
    "rollout.partial_max_cuts": "megatron_rl.loop.step.collect:collect_batch",
    "rollout.stop_token_ids": "megatron_rl.rollout.vllm_engine:VLLMEngine",
    "rollout.turn_max_tokens": "megatron_rl.loop.step.components:build_turns",
    "rollout.observation_max_tokens": "megatron_rl.loop.step.components:build_turns",
    "rollout.turn_penalty": "megatron_rl.train:main",
    "cluster.preflight_gemm_fraction": "megatron_rl.system.preflight:Expected.from_cluster",
    "cluster.preflight_memory_fraction": "megatron_rl.system.preflight:Expected.from_cluster",
    "cluster.preflight_allreduce_fraction": "megatron_rl.system.preflight:Expected.from_cluster",
    "reward.endpoints_wait_s": "megatron_rl.reward.remote:read_endpoints",
    "reward.remote_timeout_s": "megatron_rl.reward.remote:Fleet.score",
    "reward.remote_attempts": "megatron_rl.reward.remote:Fleet.score",
    "reward.http_timeout_s": "megatron_rl.reward.remote:HttpJudge.__call__",
    "reward.http_retries": "megatron_rl.reward.remote:HttpJudge.__call__",
    "reward.http_token_env": "megatron_rl.reward.remote:HttpJudge.__init__",
    "rollout.env_timeout_s": "megatron_rl.loop.step.components:build_turns",
    "rollout.enforce_eager": "megatron_rl.rollout.vllm_engine:VLLMEngine",
    "rollout.on_logprob_disagreement": "megatron_rl.loop.step.components:build_refusals",
    "rollout.logprob_max_gap": "megatron_rl.rollout.agreement:thresholds_of",
    "rollout.logprob_mean_gap": "megatron_rl.rollout.agreement:thresholds_of",
    "rollout.logprob_probe_prompts": "megatron_rl.rollout.agreement:probe_shape",
    "rollout.logprob_probe_tokens": "megatron_rl.rollout.agreement:probe_shape",
    "rollout.dtype": "megatron_rl.rollout.agreement:dtypes_of",
    "rollout.on_refused_publication": "megatron_rl.loop.step.components:build_refusals",
    "rollout.max_refused_publications": "megatron_rl.loop.step.components:build_refusals",
    # ProblemTask (every source but synthetic) needs the model's tokenizer, which the tiny recipe lacks.
    "data.shuffle": "megatron_rl.data.task:ProblemTask",
    "data.columns": "megatron_rl.data.task:ProblemTask",
    "data.system_prompt": "megatron_rl.data.task:ProblemTask",
    "reward.function": "megatron_rl.reward.pool:RewardPool",
    "reward.mode": "megatron_rl.reward.pool:RewardPool",
    "reward.unsafe_local": "megatron_rl.reward.pool:RewardPool",
    "reward.workers": "megatron_rl.loop.step.components:build_reward_pool",
    "reward.timeout_s": "megatron_rl.reward.pool:RewardPool",
    "reward.memory_mb": "megatron_rl.reward.pool:RewardPool",
    "checkpoint.dir": "megatron_rl.loop.step.components:build_checkpointer",
    "checkpoint.keep_last": "megatron_rl.loop.step.components:build_checkpointer",
    "checkpoint.keep_every": "megatron_rl.loop.step.components:build_checkpointer",
    "checkpoint.resume": "megatron_rl.loop.step.components:resume",
    "logger.wandb": "megatron_rl.loop.record.records:RunLog",
    "logger.project": "megatron_rl.loop.record.records:RunLog",
    "logger.group": "megatron_rl.loop.record.records:RunLog",
    "logger.run_dir": "megatron_rl.loop.record.start:start_run",
    "logger.progress": "megatron_rl.loop.record.records:RunLog",
    "logger.no_signal_steps": "megatron_rl.loop.record.records:RunLog",
    "logger.samples_per_step": "megatron_rl.loop.record.records:RunLog",
    "cluster.dist_timeout_s": "megatron_rl.loop.placement.processes:Processes",
    "cluster.max_restarts": "megatron_rl.cli.failover:job_settings",
    "optim.lr_schedule": "megatron_rl.trainer.build:optim_settings",
    "seed": "megatron_rl.train:main",
    "rollout.top_p": "megatron_rl.rollout.vllm_engine:VLLMEngine",
    "rollout.top_k": "megatron_rl.rollout.vllm_engine:VLLMEngine",
    "rollout.seed": "megatron_rl.loop.step.components:build_engine",
    "reward.kind": "megatron_rl.reward.pool:RewardPool",
}


def _single_choice() -> set[str]:
    from megatron_rl.check.ranges import ENUMS

    return {k for k, allowed in ENUMS.items() if len(allowed) == 1}


def _leaves() -> list[str]:
    out = []
    for f in dataclasses.fields(RecipeConfig):
        group = GROUPS.get(f.name)
        out += [f"{f.name}.{g.name}" for g in dataclasses.fields(group)] if group else [f.name]
    return out


def _recording(obj, prefix: str, reads: set[str]):
    """`obj` with its class swapped for a subclass that records reads of its fields from the package."""
    cls, names = type(obj), {f.name for f in dataclasses.fields(obj)}

    def __getattribute__(self, name):
        if name in names:
            caller = Path(sys._getframe(1).f_code.co_filename)
            if caller.is_relative_to(PACKAGE) and caller not in NOT_EVIDENCE:
                reads.add(prefix + name)
        return object.__getattribute__(self, name)

    obj.__class__ = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__})
    return obj


def _consume(recipe) -> None:
    """What reads a recipe without processes, engines or GPUs."""
    from megatron_rl.check.recipe import check_recipe
    from megatron_rl.cli.submit import request_from_recipe, sbatch_command
    from megatron_rl.loop.record.start import header
    from megatron_rl.loop.step import components
    from megatron_rl.models.spec import ModelSpec
    from megatron_rl.plan.cycle import cycle
    from megatron_rl.plan.reliability import reliability
    from megatron_rl.trainer.build import optim_settings

    check_recipe(recipe)
    run = resolve(recipe)  # the one place the layout, the spec, the sampling... are read (run/resolve.py)
    inp, lay = inputs_from_run(run), run.layout
    reliability(inp, lay, cycle(inp, lay).step_s)
    ModelSpec.from_config(recipe.model)
    optim_settings(recipe)
    sbatch_command(request_from_recipe(recipe), recipe.name, [])
    components.checkpoint_interval(run)
    components.trainer_temperature(recipe.rollout)
    components.build_task(run)
    header(run, Path("outputs"))


@pytest.fixture(scope="module")
def reads() -> set[str]:
    seen: set[str] = set()
    recipe = load_recipe("grpo_tiny_cpu")
    for name in GROUPS:
        _recording(getattr(recipe, name), f"{name}.", seen)
    _consume(_recording(recipe, "", seen))
    return seen


def test_every_schema_key_is_read(reads):
    excused = READ_ELSEWHERE.keys() | _single_choice()
    ignored = [k for k in _leaves() if k not in reads and k not in excused]
    assert not ignored, (
        f"schema keys accepted but read by nothing this test runs: {ignored}. Read them, remove them, "
        "or (when only a process/engine/GPU path reads them) list the function in READ_ELSEWHERE"
    )


@pytest.mark.parametrize("key", sorted(READ_ELSEWHERE))
def test_a_key_read_elsewhere_is_read_by_its_function(key):
    """The listed function's source reads the field (`.field`), and the key is in the schema."""
    assert key in _leaves(), f"{key} is not a schema key: drop it from READ_ELSEWHERE"
    module, qualname = READ_ELSEWHERE[key].split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    field = key.rsplit(".", 1)[-1]
    assert f".{field}" in inspect.getsource(obj), f"{READ_ELSEWHERE[key]} does not read {key}"


def test_the_recorder_sees_reads_from_the_package_only():
    """The instrument itself: a read from the package counts, one from this test does not."""
    from megatron_rl.trainer.build import optim_settings

    seen: set[str] = set()
    recipe = load_recipe("grpo_tiny_cpu")
    _recording(recipe.optim, "optim.", seen)
    _recording(recipe.algorithm, "algorithm.", seen)
    assert recipe.optim.lr > 0 and not seen
    optim_settings(recipe)
    assert {"optim.lr", "optim.warmup_steps", "algorithm.minibatches"} <= seen
