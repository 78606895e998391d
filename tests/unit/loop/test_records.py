"""The run's records (loop/record/records.py) and the processes (loop/placement/processes.py) apart, in one process.

Without torch.distributed the per-step reductions are this rank's own figures, so a record can be
checked line by line; the multi-rank path is exercised by the driver's integration tests."""

import io
import json
import time
import types

from megatron_rl.config.load import load_recipe
from megatron_rl.loop.placement.processes import Processes
from megatron_rl.loop.record.records import RunLog
from megatron_rl.parallel.layout import ParallelLayout


class _Console:  # the two things RunLog uses of telemetry/console.py's Console
    def __init__(self):
        self.said: list[str] = []
        self.terminal = io.StringIO()

    def say(self, text: str) -> None:
        self.said.append(text)


def _recipe():
    return load_recipe("grpo_tiny_cpu", ["logger.wandb=false", "logger.progress=false", "steps=2"])


def test_rank_0_writes_the_records_and_closes_with_the_summary(tmp_path):
    out = _Console()
    run = RunLog(_recipe(), tmp_path / "my-run", out, is_main=True, cpu_group=None)
    assert (
        run.name == "my-run" and json.loads((tmp_path / "my-run" / "recipe.json").read_text())["steps"] == 2
    )
    run.start_progress(0)
    for step in (1, 2):
        with run.phase("generation"):
            run.note_memory("train_end", {"allocated_gib": 1.0})
            time.sleep(0.01)
            run.note_memory("trainer_offloaded", {"allocated_gib": 0.5})
        record = run.record(step, {"reward": {"mean": 0.25 * step}})
        assert record["switch_seconds"] > 0 and record["step_seconds"] >= 0.01
        assert record["timeshare_memory"] == {
            "train_end": {"allocated_gib": 1.0},
            "trainer_offloaded": {"allocated_gib": 0.5},
        }
    assert run.switch_memory == {} and run.switch_times == {}  # taken by each record
    run.finish()
    lines = (tmp_path / "my-run" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert len((tmp_path / "my-run" / "spans.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "my-run" / "timeline.png").exists()
    assert out.said[0].startswith("reward: first-1 mean 0.2500, last-1 mean 0.5000")
    assert (
        out.said[-1]
        == f"outputs in {tmp_path / 'my-run'}/; the full report: megatron-rl report {tmp_path / 'my-run'}"
    )


def test_other_ranks_time_their_phases_but_write_and_say_nothing(tmp_path):
    out = _Console()
    run = RunLog(_recipe(), tmp_path / "my-run", out, is_main=False, cpu_group=None)
    run.start_progress(0)
    with run.phase("generation"):
        pass
    assert run.record(1, {"reward": {"mean": 1.0}})["step"] == 1
    run.say("not for the terminal")
    run.finish()
    assert not (tmp_path / "my-run").exists() and out.said == [] and run.records == []


def test_processes_read_rank_layout_and_gloo_group_from_the_parallel_state():
    layout = ParallelLayout.over(4, 2, 1)
    state = types.SimpleNamespace(env=types.SimpleNamespace(rank=3), layout=layout, cpu_group="gloo")
    procs = Processes(state, dp_group="dp")
    assert (procs.rank, procs.is_main, procs.layout, procs.cpu_group) == (3, False, layout, "gloo")
    assert Processes(types.SimpleNamespace(env=types.SimpleNamespace(rank=0)), None).is_main
