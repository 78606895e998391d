"""The path a user with an HF checkpoint takes, end to end on CPU (`grpo_tiny_hf_cpu`, ~2 min):
a Qwen2-format checkpoint (built on first use) with a trained BPE tokenizer, chat template and two
end ids -> import -> chat template -> generation that stops at the end ids -> sandbox -> update ->
publication -> checkpoint -> HF export; then transformers loads the export and greedy-decodes the
same tokens as a vLLM engine on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.launch import REPO, run_worker, torchrun
from tests.helpers.tiny_run import assert_no_alarm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_path")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "PYTHONPATH": str(REPO),
        "MEGATRON_RL_RUN_NAME": "hf",
        "MEGATRON_RL_FIXTURES": str(tmp / "fixtures"),  # where the recipe's checkpoint is built
    }
    overrides = [
        f"steps={STEPS}",
        f"logger.run_dir={tmp / 'outputs'}",
        f"checkpoint.dir={tmp / 'ckpt'}",
        "logger.wandb=false",
        "logger.progress=false",
    ]
    cmd = [sys.executable, "-m", "megatron_rl.cli.launch_local", "grpo_tiny_hf_cpu", *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (tmp / "console.txt").write_text(proc.stdout + proc.stderr)
    records = [json.loads(line) for line in (tmp / "outputs" / "hf" / "steps.jsonl").read_text().splitlines()]
    export = tmp / "export"
    torchrun(
        REPO / "tools/export_hf.py",
        2,
        ["grpo_tiny_hf_cpu", str(tmp / "ckpt" / "hf"), str(export), *overrides],
        timeout=600,
        env={"MEGATRON_RL_FIXTURES": str(tmp / "fixtures")},
    )
    out = tmp / "roundtrip.json"
    run_worker(REPO / "tests/integration/loop/worker_hf_roundtrip.py", [str(out), str(export)])
    return tmp, records, json.loads(out.read_text())


def test_the_run_generates_from_the_chat_template_and_stops_at_end_ids(run):
    tmp, records, _ = run
    assert_no_alarm(records)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    fixture = json.loads((tmp / "fixtures" / "qwen2" / "fixture.json").read_text())
    assert len(fixture["generation_eos"]) == 2  # <|im_end|> and <|endoftext|>
    # Some samples end at an end id, the rest at the 64-token cap: both are counted.
    assert sum(r["stop_fraction"] for r in records) > 0, [r["stop_fraction"] for r in records]
    assert all(r["completion_tokens_max"] <= 64 for r in records)
    assert all(r["publication"]["activated"] for r in records)


def test_a_run_of_random_weights_says_once_that_it_cannot_learn_and_why(run):
    """Issue 36's run: completions without code, every reward 0. The console says so once (at the third
    flat step, logger.no_signal_steps), naming the status; the samples are there to read, chat template and all."""
    tmp, records, _ = run
    assert all(r["reward"]["max"] == 0 and r["reward"]["flat_group_fraction"] == 1.0 for r in records)
    console = (tmp / "console.txt").read_text()
    said = [line for line in console.splitlines() if "no learning signal" in line]
    assert len(said) == 1, console[-4000:]
    assert said[0].startswith(
        "warning: no learning signal for 3 steps in a row (steps 1-3): every reward was 0"
    )
    assert "% no_code: the completions hold no code block" in said[0], said[0]
    assert said[0].endswith(f"(read a few in {tmp / 'outputs' / 'hf' / 'samples.jsonl'})")
    rows = [json.loads(line) for line in (tmp / "outputs" / "hf" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * STEPS and all(r["prompt"].startswith("<|im_start|>") for r in rows)
    assert {r["status"] for r in rows} <= {"no_code", "syntax_error"}


def test_the_export_decodes_token_for_token_like_the_engine(run):
    _, _, rt = run
    assert len(rt["hf"]) > 0
    assert rt["engine"] == rt["hf"], rt
    assert rt["stops"] == sorted(rt["stops"]) and len(rt["stops"]) == 2
