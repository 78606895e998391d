"""Conversion faults the checksums cannot see, injected into real runs' publications (reshard/faults.py):
on the colocated, separated and MoE paths, every faulty version is refused by the log-prob probe before
it serves (loop/placement/probe.py), the version before it keeps serving, and the clean versions after it activate;
a clean HF-fixture run with a bf16 engine raises no alarm (fp32 clean runs: test_tiny_loop, test_hf_path,
test_tiny_moe and test_separated assert the same of theirs).

Each run: version 1 clean, one fault per version from 2 on, then clean versions again; the refusal
policy's limit is raised so that the run goes on through every fault (the default, three in a row, is
tested in tests/unit/loop/test_probe_policy.py)."""

from __future__ import annotations

import os

import pytest

from megatron_rl.reshard.faults import DENSE, ENV, MOE
from tests.helpers.tiny_run import launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
GO_ON = ["rollout.max_refused_publications=20", "logger.wandb=false", "checkpoint.interval=0"]
PATHS = {
    "colocated": ("grpo_tiny_cpu", DENSE, []),
    "separated": ("grpo_tiny_cpu_separated", DENSE, []),
    "moe": ("grpo_tiny_moe_cpu", DENSE + MOE, ["optim.micro_batch_size=4"]),
}


def _plan(faults) -> dict[int, str]:
    return {v: f for v, f in enumerate(faults, start=2)}


@pytest.fixture(scope="module", params=sorted(PATHS))
def faulty(request, tmp_path_factory):
    recipe, faults, extra = PATHS[request.param]
    plan = _plan(faults)
    tmp = tmp_path_factory.mktemp(f"faults-{request.param}")
    env = {ENV: ",".join(f"{f}@{v}" for v, f in plan.items())}
    launch(tmp, len(plan) + 3, [*GO_ON, *extra], name="f", recipe=recipe, env=env)
    return plan, records(tmp, "f"), (tmp / "f.log").read_text()


def test_every_faulty_version_is_refused_before_it_serves(faulty):
    plan, recs, console = faulty
    by_step = {r["step"]: r for r in recs}
    assert sorted(by_step) == list(range(1, len(plan) + 4))
    for version, fault in plan.items():
        r = by_step[version]  # step s publishes version s
        pub = r["publication"]
        assert not pub["activated"], (fault, pub)
        assert pub["probe"]["version"] == version and pub["probe"]["passed"] is False, (fault, pub["probe"])
        assert pub["refused"][0].startswith("log-prob probe (fp32 trainer, fp32 engine): engine "), fault
        # The manifest passed (the bytes arrived as sent): the probe alone refused it.
        assert len(pub["refused"]) == 1
        assert r["version"] == 1 and pub["action"] == "sampled with the active version 1", fault
        line = f"publication of version {version} (step {version}) refused"
        assert console.count(line) == 1, (fault, console[-3000:])


def test_clean_versions_serve_and_agree(faulty):
    plan, recs, _ = faulty
    for r in recs:
        if r["step"] in plan:
            continue
        pub = r["publication"]
        assert pub["activated"] and pub["probe"]["passed"], (r["step"], pub)
        assert pub["probe"]["max_abs_diff"] < pub["probe"]["max_gap"] / 5, pub["probe"]
        assert r["logprob_agreement"]["problems"] == []
    assert recs[-1]["version"] == len(plan) + 3  # the last step's version activated and served


@pytest.fixture(scope="module")
def hf_bf16(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-bf16")
    env = {"MEGATRON_RL_FIXTURES": os.environ["MEGATRON_RL_FIXTURES"]}
    extra = ["rollout.dtype=bf16", "logger.wandb=false", "checkpoint.interval=0"]
    launch(tmp, 3, extra, name="b", recipe="grpo_tiny_hf_cpu", env=env)
    return records(tmp, "b")


def test_a_bf16_engine_serving_an_fp32_trainer_raises_no_alarm(hf_bf16):
    for r in hf_bf16:
        probe = r["publication"]["probe"]
        assert probe["passed"] and r["publication"]["activated"], probe
        assert r["logprob_agreement"]["problems"] == [], r["logprob_agreement"]
        # bf16 rounding, well above fp32's and well under the bf16 thresholds
        assert 1e-4 < probe["max_abs_diff"] < probe["max_gap"] / 3, probe
