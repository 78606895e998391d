"""`megatron-rl export`'s sizing and paths (the export itself: tests/integration/checkpoint/test_export_command.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_rl.cli.export import launched, log_path, replica_layout
from megatron_rl.parallel.layout import ParallelLayout


@pytest.mark.parametrize(
    ("layout", "ranks"),
    [
        (ParallelLayout(tp=2, engine_count=2), 2),  # grpo_tiny_cpu
        (ParallelLayout(tp=4, dp=2, engine_tp=2, engine_count=4), 4),  # qwen2.5-7b: one of its two replicas
        (ParallelLayout(tp=8, pp=2, dp=4, engine_tp=8, engine_count=8), 16),  # llama3.1-70b
        (ParallelLayout(dp=2, ep=2, engine_count=2), 2),  # tiny MoE: EP2 needs two ranks of a stage
        (ParallelLayout(tp=2, pp=2, dp=8, ep=8, engine_tp=4, engine_count=8), 16),  # qwen3-30b-a3b: DP4
        (ParallelLayout(tp=4, dp=4, ep=2, etp=2), 4),  # EP x ETP = 4 fits in TP4 already
    ],
)
def test_an_export_runs_one_replica_of_the_layout(layout, ranks):
    one = replica_layout(layout)
    assert one.trainer_world == ranks
    assert (one.tp, one.pp, one.cp) == (layout.tp, layout.pp, layout.cp)
    assert (one.tp * one.cp * one.dp) % (one.ep * one.etp) == 0  # megatron-core can carve the experts


def test_the_log_sits_beside_the_folder_not_in_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert log_path("hf") == tmp_path / "hf.log"
    assert log_path(tmp_path / "a" / "hf/") == tmp_path / "a" / "hf.log"
    assert not log_path("hf").is_relative_to(Path("hf").resolve())


def test_a_plain_shell_is_not_a_rank(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    assert not launched()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launched()
