"""The one recipe check: every number range-checked, and whatever the driver refuses, validate refuses first."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from megatron_rl.check.ranges import ENUMS, NUMERIC
from megatron_rl.check.recipe import check_recipe, refused
from megatron_rl.config import schema
from megatron_rl.config.load import load_recipe

CONVENTION = {"rollout.temperature", "rollout.top_p", "rollout.top_k"}  # rollout/convention.py


def _numeric_keys(node: type, prefix: str = "") -> list[str]:
    """Every int/float (or list of them) field of the schema, by dotted key."""
    hints = typing.get_type_hints(node, vars(schema))
    out = []
    for f in dataclasses.fields(node):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += _numeric_keys(t, f"{prefix}{f.name}.")
            continue
        args = set(typing.get_args(t)) | {t}
        inner = {a for x in args for a in typing.get_args(x)} | args
        if (int in inner or float in inner) and bool not in inner:
            out.append(prefix + f.name)
    return out


def test_every_numeric_key_of_the_schema_has_a_range():
    keys = _numeric_keys(schema.RecipeConfig)
    assert len(keys) > 60, keys  # the walk found the schema
    missing = [k for k in keys if k not in NUMERIC and k not in ENUMS and k not in CONVENTION]
    assert missing == [], f"give these a range in megatron_rl/check/ranges.py NUMERIC: {missing}"
    stale = [k for k in NUMERIC if k not in keys]
    assert stale == [], f"NUMERIC names keys the schema does not have: {stale}"
    unbounded = [k for k, (_, hi, _, _) in NUMERIC.items() if hi is None]
    assert unbounded == [], f"give these an upper bound (what a real run could need): {unbounded}"


def _outside(rng) -> list:
    """Values just outside a range, plus the non-finite ones."""
    lo, hi, lo_in, hi_in = rng
    bad = [float("nan"), float("inf"), float("-inf")]
    if lo is not None:
        bad.append(lo - 1 if lo_in else lo)
    if hi is not None:
        bad.append(hi + 1 if hi_in else hi)
    return bad


CASES = [(k, v) for k, rng in NUMERIC.items() for v in _outside(rng)]


@pytest.fixture(scope="module")
def tiny():
    return load_recipe("grpo_tiny_cpu")


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_each_out_of_range_value_is_refused_naming_its_key(tiny, key, value):
    recipe = dataclasses.replace(tiny)  # shallow: rebuild the group we touch
    group, _, leaf = key.rpartition(".")
    if group:
        sub = dataclasses.replace(getattr(tiny, group))
        old = getattr(sub, leaf)
        setattr(sub, leaf, [value] if isinstance(old, list) else value)
        setattr(recipe, group, sub)
    else:
        setattr(recipe, leaf, value)
    problems = check_recipe(recipe)
    assert any(p.key == key for p in problems), f"{key}={value} passed: {problems}"


@pytest.mark.parametrize(
    "override",
    [
        "rollout.temperature=nan",
        "optim.lr=-1",
        "steps=-5",
        "reward.timeout_s=-1",
        "reward.workers=-3",
        "checkpoint.keep_last=-1",
        "rollout.gpu_memory_utilization=5",
        "algorithm.kl_coef=nan",
        "rollout.top_k=-2",
        "rollout.top_p=0",
        "optim.adam_beta2=1",
        "rollout.stop_token_ids=[5,-1]",
        "optim.lr=1e38",  # finite, but Adam's first step lr / (1 - beta1) overflows float32
        "reward.timeout_s=1e10",  # scoring died with an OverflowError traceback
        f"rollout.samples_per_prompt={10**12}",
        f"reward.memory_mb={10**8}",
        "checkpoint.dir=''",  # checkpoints would land in whatever the current directory is
        "cluster.dist_timeout_s=1e9",
    ],
)
def test_the_reported_values_are_refused(override):
    key = override.split("=")[0]
    problems = check_recipe(load_recipe("grpo_tiny_cpu", [override]))
    assert [p.key for p in problems] == [key], problems


def test_the_shipped_values_pass():
    assert check_recipe(load_recipe("grpo_tiny_cpu")) == []


# Settings the training driver cannot run yet: refused by validate (kind "driver"), modelled by the planner.
DRIVER_ONLY = [
    (["rollout.top_p=0.9"], "rollout.top_p"),
    (["rollout.top_k=20"], "rollout.top_k"),
    (["layout.cp=2", "layout.dp=1", "layout.tp=1", "cluster.gpus_per_node=2"], "layout.cp"),
]


@pytest.mark.parametrize("overrides,key", DRIVER_ONLY, ids=[k for _, k in DRIVER_ONLY])
def test_what_the_driver_refuses_validate_refuses_and_the_planner_models(overrides, key):
    problems = check_recipe(load_recipe("grpo_tiny_cpu", overrides))
    driver = [p for p in problems if p.kind == "driver"]
    assert [p.key for p in driver] == [key], problems
    assert refused(problems, "validate") and refused(problems, "run")
    assert not refused(problems, "plan"), problems


def test_async_needs_separated_pools():
    colocated = check_recipe(
        load_recipe("grpo_tiny_cpu", ["layout.synchrony=async", "algorithm.truncated_is_cap=2"])
    )
    assert [(p.key, p.kind) for p in colocated] == [("layout.synchrony", "recipe")]
    assert "nothing to overlap" in colocated[0].message


def test_separated_pools_validate_sync_and_async():
    assert check_recipe(load_recipe("grpo_tiny_cpu_separated")) == []
    assert check_recipe(load_recipe("grpo_tiny_cpu_separated", ["layout.synchrony=async"])) == []
    # the 2-process demo's pools as 2 trainer + 2 engine ranks on two "nodes"
    two = ["layout.placement=separated", "cluster.nodes=2", "algorithm.truncated_is_cap=2"]
    assert check_recipe(load_recipe("grpo_tiny_cpu", two)) == []


def test_async_without_an_off_policy_correction_is_refused():
    """The loss would treat one-update-old samples as on-policy: refused, and the fix is named."""
    problems = check_recipe(
        load_recipe("grpo_tiny_cpu_separated", ["layout.synchrony=async", "algorithm.truncated_is_cap=0"])
    )
    assert [p.key for p in problems] == ["algorithm.truncated_is_cap"], problems
    assert "truncated_is_cap" in problems[0].message and "old_logprobs=engine" in problems[0].message
    # the engines' own log-probs as the old ones: the clipped ratio is then against the behaviour policy
    ok = ["layout.synchrony=async", "algorithm.truncated_is_cap=0", "algorithm.old_logprobs=engine"]
    assert check_recipe(load_recipe("grpo_tiny_cpu_separated", ok)) == []
    for k in (0, 2):
        over = ["layout.synchrony=async", f"rollout.max_staleness={k}"]
        keys = [p.key for p in check_recipe(load_recipe("grpo_tiny_cpu_separated", over))]
        assert keys == ["rollout.max_staleness"], k
    # synchronous runs never read it
    assert check_recipe(load_recipe("grpo_tiny_cpu_separated", ["rollout.max_staleness=0"])) == []


def test_missing_files_are_refused_by_the_driver_and_by_validate_where_the_recipe_runs(tmp_path):
    from megatron_rl.check.recipe import blocking, notes

    recipe = load_recipe(
        "grpo_tiny_cpu", [f"model.hf_checkpoint={tmp_path}/nope", f"data.source={tmp_path}/none.jsonl"]
    )
    problems = check_recipe(recipe)
    assert {p.key for p in problems} == {"model.hf_checkpoint", "data.source"}
    assert refused(problems, "run") and not refused(problems, "validate")  # not refused wherever it runs
    # A CPU recipe runs on this machine (`megatron-rl run`): validate refuses what the run could not read.
    assert blocking(problems, recipe, "validate") == problems
    assert all(line.startswith("not checked here:") for line in notes(problems, "validate"))
    from megatron_rl.models.tiny import hf_config, tiny_spec

    # The tiny recipe's own model as a checkpoint config (the recipe's keys must agree with it).
    hf_config(tiny_spec(vocab_size=17, max_position_embeddings=256)).save_pretrained(tmp_path / "nope")
    (tmp_path / "none.jsonl").write_text("")
    assert check_recipe(recipe, read_data=False) == []
    # Read, the data is refused for what it holds (here: nothing).
    [p] = check_recipe(recipe)
    assert p.key == "data.source" and "contains no problems" in p.message


def test_ranges_reject_what_math_would_accept():
    # -0.0, True (a bool is an int in Python) and a huge int are the inputs a sloppy check lets through.
    recipe = load_recipe("grpo_tiny_cpu")
    recipe.optim.adam_eps = -0.0
    recipe.reward.workers = True
    recipe.steps = 10**30
    keys = {p.key for p in check_recipe(recipe)}
    assert {"optim.adam_eps", "reward.workers"} <= keys
    assert math.isfinite(recipe.steps)  # a huge step count is a valid (if long) run


# Inputs each newer rule exists for: a recipe the check would otherwise pass and the driver then fails on.
@pytest.mark.parametrize(
    "overrides,key",
    [
        (["cluster.time_limit=''"], "cluster.time_limit"),  # sbatch --time= would reach Slurm
        (["name=.."], "name"),  # outputs/.. would be the run folder
        (["model.vocab_size=" + "9" * 20], "model.vocab_size"),  # overflows the planner's floats
    ],
)
def test_values_the_driver_would_choke_on(overrides, key):
    assert key in {p.key for p in check_recipe(load_recipe("grpo_tiny_cpu", overrides))}


def test_a_pipeline_split_megatron_core_would_build_differently():
    # megatron-core takes first/last stage sizes and divides the middle evenly: [4, 10, 8, 6] would be
    # built as [4, 9, 9, 6] while the publisher assumed the former.
    recipe = load_recipe(
        "grpo_qwen2.5-7b_1n8g", ["layout.tp=2", "layout.pp=4", "layout.dp=1", "layout.pp_layers=[4,10,8,6]"]
    )
    assert any(p.key == "layout.pp_layers" and "middle" in p.message for p in check_recipe(recipe))
    even = load_recipe(
        "grpo_qwen2.5-7b_1n8g", ["layout.tp=2", "layout.pp=4", "layout.dp=1", "layout.pp_layers=[5,9,9,5]"]
    )
    assert not any(p.key == "layout.pp_layers" for p in check_recipe(even))


def test_paths_the_driver_reads_late_are_checked_first(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    recipe = load_recipe(
        "grpo_tiny_cpu",
        [
            f"checkpoint.resume={tmp_path}/missing",
            f"logger.run_dir={a_file}/outputs",
            "reward.kind=function",
            "reward.function=no_such_module_xyz:score",
        ],
    )
    files = {p.key for p in check_recipe(recipe) if p.kind == "files"}
    assert files == {"checkpoint.resume", "logger.run_dir", "reward.function"}
    ok = load_recipe("grpo_tiny_cpu", [f"checkpoint.resume={tmp_path}", f"logger.run_dir={tmp_path}/out"])
    assert check_recipe(ok) == []


def test_truncated_is_against_the_engines_own_logprobs_is_refused():
    """With old_logprobs=engine the capped weight pi_old / pi_engine is always 1: the correction a user
    asked for would silently not apply."""
    problems = check_recipe(
        load_recipe("grpo_tiny_cpu", ["algorithm.old_logprobs=engine", "algorithm.truncated_is_cap=2.0"])
    )
    assert [p.key for p in problems] == ["algorithm.truncated_is_cap"] and "every weight is 1" in str(
        problems[0]
    )
    for ok in (["algorithm.old_logprobs=engine"], ["algorithm.truncated_is_cap=2.0"]):
        assert check_recipe(load_recipe("grpo_tiny_cpu", ok)) == []


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        (
            ["rollout.oversample=1.0000000001"],
            "adds no prompt",
        ),  # 4 prompts per engine: ceil(4.0000000004) = 4
        (["rollout.oversample=5"], "must be <= 4"),
        (
            [
                "rollout.oversample=1.5",
                "data.prompts_per_step=1",
                "algorithm.minibatches=1",
                "optim.micro_batch_size=4",
            ],
            "a prompt per engine",
        ),
    ],
)
def test_oversample_that_would_do_nothing_or_flood_the_engines_is_refused(overrides, fragment):
    problems = check_recipe(load_recipe("grpo_tiny_cpu", overrides))
    assert [p.key for p in problems] == ["rollout.oversample"], problems
    assert fragment in problems[0].message
    assert (
        check_recipe(load_recipe("grpo_tiny_cpu", ["rollout.oversample=1.01"])) == []
    )  # one more per engine


PARTIAL = ["rollout.partial=true", "rollout.oversample=1.5", "algorithm.truncated_is_cap=2.0"]


@pytest.mark.parametrize(
    "overrides,key,fragment",
    [
        (
            ["rollout.partial=true", "algorithm.truncated_is_cap=2.0"],
            "rollout.partial",
            "rollout.oversample > 1",
        ),
        ([*PARTIAL, "algorithm.dynamic_sampling=true"], "rollout.partial", "dynamic_sampling"),
        ([*PARTIAL, "rollout.oversample=2.5"], "rollout.oversample", "must be <= 2"),
        (
            ["rollout.partial=true", "rollout.oversample=1.5"],
            "algorithm.truncated_is_cap",
            "partial_max_cuts=2",
        ),
        ([*PARTIAL, "rollout.partial_max_cuts=0"], "rollout.partial_max_cuts", ""),
        (["data.tail_share=0.2", "data.short_answer_tokens=8"], "data.short_answer_tokens", "below"),
        (["data.tail_share=1.0"], "data.tail_share", ""),
    ],
)
def test_partial_rollouts_and_the_tail_task_refuse_what_would_break_or_do_nothing(overrides, key, fragment):
    """Partial rollouts with nothing in flight beyond the batch never cut; with dynamic sampling a round
    would continue another's groups; without a correction, carried (older) tokens pass as on-policy. A
    tail whose short answers are as long as the long ones is no tail."""
    problems = check_recipe(load_recipe("grpo_tiny_cpu", overrides))
    assert [p.key for p in problems] == [key], problems
    assert fragment in problems[0].message
    for ok in (PARTIAL, [*PARTIAL[:2], "algorithm.old_logprobs=engine"], ["data.tail_share=0.2"]):
        assert check_recipe(load_recipe("grpo_tiny_cpu", ok)) == []


def test_the_tail_share_is_refused_on_a_problem_source(tmp_path):
    cfg = load_recipe("grpo_tiny_hf_cpu", ["data.tail_share=0.2"])
    assert "data.tail_share" in {p.key for p in check_recipe(cfg, read_data=False)}


BATCH_KEYS = (
    "data.prompts_per_step",
    "rollout.samples_per_prompt",
    "algorithm.minibatches",
    "layout.dp",
    "optim.micro_batch_size",
)


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim.micro_batch_size=3"],  # the first edit a user makes
        ["algorithm.minibatches=3"],
        ["data.prompts_per_step=6"],
        ["layout.tp=1", "layout.dp=2", "optim.micro_batch_size=1", "algorithm.minibatches=64"],
        ["optim.micro_batch_size=128"],
    ],
    ids=lambda o: " ".join(o),
)
def test_a_batch_that_does_not_split_names_every_key_and_values_that_fit(overrides):
    """The refusal names the five keys of the one equation, and each value it suggests, set alone, fits."""
    [problem] = [
        p for p in check_recipe(load_recipe("grpo_tiny_cpu", overrides)) if "The batch:" in p.message
    ]
    assert all(f"{key}=" in problem.message for key in BATCH_KEYS), problem.message
    listed = problem.message.split("Values that fit, one key changed: ")[1]
    fixes = [
        (key, value)
        for part in listed.split("; ")
        for key, values in [part.split("=")]
        for value in values.split(" or ")
    ]
    assert len({key for key, _ in fixes}) >= 2, listed
    assert "layout.dp" not in {key for key, _ in fixes}  # set by the world size, not a batch knob
    for key, value in fixes:
        after = check_recipe(load_recipe("grpo_tiny_cpu", [*overrides, f"{key}={value}"]))
        assert not [p for p in after if "The batch:" in p.message], (key, value, after)


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["reward.endpoints=[node1]"], "reward.endpoints", "not host:port"),
        (["reward.endpoints=[a:1]", "reward.endpoints_file=/x"], "reward.endpoints", "give one of them"),
        (
            ["reward.endpoints=[a:1]", "reward.kind=http", "reward.url=http://j"],
            "reward.endpoints",
            "kind=http",
        ),
        (["reward.kind=http"], "reward.url", "must be an http(s) URL"),
        (["reward.kind=http", "reward.url=judge.local:80"], "reward.url", "must be an http(s) URL"),
        (["reward.url=http://judge"], "reward.url", "only read with reward.kind=http"),
        (["reward.remote_attempts=0"], "reward.remote_attempts", ""),
    ],
)
def test_the_reward_fleet_and_http_judges_are_checked(overrides, key, words):
    problems = [p for p in check_recipe(load_recipe("grpo_tiny_cpu", overrides)) if p.key == key]
    assert problems and words in problems[0].message, problems
    ok = ["reward.endpoints=[node1:8471,node2:8471]"]
    assert check_recipe(load_recipe("grpo_tiny_cpu", ok)) == []
    assert (
        check_recipe(load_recipe("grpo_tiny_cpu", ["reward.kind=http", "reward.url=http://judge:8000/r"]))
        == []
    )


def test_an_unreadable_checkpoint_still_gets_the_rules_that_need_no_shape(tmp_path):
    """A model shape unknown here skips the rules that need it, not the others: a batch that cannot split
    and a number out of range are refused whatever the checkpoint holds (they passed `validate` before, and
    failed once the checkpoint appeared)."""
    gone = f"model.hf_checkpoint={tmp_path}/not_yet"
    ok = {p.key for p in check_recipe(load_recipe("grpo_tiny_hf_cpu", [gone]))}
    assert ok == {"model.hf_checkpoint"}, ok  # the shape is unknown: noted, nothing else wrong
    bad = check_recipe(load_recipe("grpo_tiny_hf_cpu", [gone, "layout.tp=1", "layout.dp=2"]))
    assert "must divide each rank's 8 samples" in {p.key: p.message for p in bad}["optim.micro_batch_size"]
    bad = check_recipe(load_recipe("grpo_tiny_hf_cpu", [gone, "optim.lr=-1"]))
    assert {p.key for p in bad} == {"model.hf_checkpoint", "optim.lr"}
    # PPO's critic at a layout that cannot split the ranks needs no shape to refuse either
    bad = check_recipe(load_recipe("grpo_tiny_hf_cpu", [gone, "algorithm=ppo", "critic.tp=3"]))
    assert "must divide the trainer's 2 ranks" in {p.key: p.message for p in bad}["critic.tp"]
