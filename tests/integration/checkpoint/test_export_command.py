"""`megatron-rl export` from a plain shell, on a real 2-step run's checkpoint (~1 min on 2 cores).

The command launches its own ranks (no torchrun on the command line), keeps the terminal to a line
before and a line after (the library warnings go to OUT.log), and writes files the group can read.
`tools/export_hf.py` from a plain shell does the same, at another layout, to the same bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import REPO
from tests.helpers.tiny_run import launch

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")


def shell(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python ARGS` as from a plain shell (no launcher's variables), umask 022, in another directory."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
        preexec_fn=lambda: os.umask(0o022),
    )


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    launch(tmp, 2, ["checkpoint.interval=2"], name="run")
    root = tmp / "ckpt" / "run"  # the run's folder: the command finds its newest complete step
    by_command = shell(["-m", "megatron_rl.cli", "export", "grpo_tiny_cpu", str(root), "hf"], cwd=tmp)
    by_tool = shell(
        [str(REPO / "tools/export_hf.py"), "grpo_tiny_cpu", str(root / "step_000002"), "hf_pp2"]
        + ["layout.tp=1", "layout.pp=2"],
        cwd=tmp,
    )
    return tmp, by_command, by_tool


def test_the_command_launches_itself_and_keeps_the_terminal_quiet(exports):
    tmp, proc, _ = exports
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) == 2, lines  # what is exported, then what was written
    assert "on 2 processes (trainer TP2 PP1 DP1)" in lines[0] and lines[1].startswith("exported ")
    assert "Warning" not in proc.stdout + proc.stderr
    # The library warnings are kept, in the log beside the folder, not in it.
    assert "UserWarning" in (tmp / "hf.log").read_text()
    assert sorted(p.name for p in (tmp / "hf").iterdir()) == [
        "config.json",
        "megatron_rl_export.json",
        "model.safetensors",
    ]


def test_every_exported_file_is_readable_by_the_group(exports):
    tmp, proc, _ = exports
    assert proc.returncode == 0, proc.stdout + proc.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp / "hf").iterdir()}
    assert set(modes.values()) == {0o644}, {k: oct(v) for k, v in modes.items()}


def test_the_tool_from_a_plain_shell_exports_the_same_bytes_at_another_layout(exports):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tmp, by_command, by_tool = exports
    assert by_tool.returncode == 0, by_tool.stdout + by_tool.stderr
    out = by_tool.stdout + by_tool.stderr
    assert "(trainer TP1 PP2 DP1)" in out and "Traceback" not in out and len(out.splitlines()) == 2
    tp2, pp2 = load_file(tmp / "hf" / "model.safetensors"), load_file(tmp / "hf_pp2" / "model.safetensors")
    assert tp2.keys() == pp2.keys() and all(torch.equal(tp2[k], pp2[k]) for k in tp2)
    model = AutoModelForCausalLM.from_pretrained(tmp / "hf_pp2")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_a_missing_checkpoint_is_one_line_before_any_process_starts(tmp_path):
    proc = shell(["-m", "megatron_rl.cli", "export", "grpo_tiny_cpu", str(tmp_path / "none"), "hf"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: no complete checkpoint at {tmp_path / 'none'} (a step_N directory with its COMPLETE marker)"
    ]
    assert not (tmp_path / "hf.log").exists()  # refused before the log (and the ranks) started
