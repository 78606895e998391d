"""The run's records (loop/record/records.py) and the processes (loop/placement/processes.py) apart, in one process.

Without torch.distributed the per-step reductions are this rank's own figures, so a record can be
checked line by line; the multi-rank path is exercised by the driver's integration tests."""

import io
import json
import logging
import re
import time
import types

from megatron_rl.config.load import load_recipe
from megatron_rl.data.synthetic import ArithmeticTask
from megatron_rl.loop.placement.processes import Processes
from megatron_rl.loop.record.records import RunLog
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.rollout.types import Sample


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
    assert out.said[0].startswith("reward: 0.2500 (step 1) -> 0.5000 (step 2), x2.00, over 2 steps\n")
    assert (
        out.said[-1]
        == f"outputs in {tmp_path / 'my-run'}/; the full report: megatron-rl report {tmp_path / 'my-run'}"
    )


def _scored(prompt: int, sample: int, status: str) -> Sample:
    s = Sample(prompt, sample, [1, 4, 16], [4, 2], [0.0, 0.0], "stop", False, 1)
    s.status = status
    return s


def _flat_step(status: str = "syntax_error") -> tuple[dict, list[Sample]]:
    """A step whose 16 samples all scored 0 with `status` (the issue's run: no code, nothing to learn)."""
    samples = [_scored(p, i, status) for p in range(4) for i in range(4)]
    reward = {"mean": 0.0, "max": 0.0, "statuses": {status: 16}, "flat_group_fraction": 1.0}
    return {"reward": reward, "train": {"grad_norm": 0.0}}, samples


def test_a_run_without_signal_says_so_once_and_keeps_samples_to_read(tmp_path, caplog):
    recipe = load_recipe(
        "grpo_tiny_cpu",
        [
            "logger.wandb=false",
            "logger.progress=false",
            "logger.no_signal_steps=2",
            "logger.samples_per_step=3",
        ],
    )
    out, task = _Console(), ArithmeticTask()
    run = RunLog(recipe, tmp_path / "flat", out, is_main=True, cpu_group=None)
    run.start_progress(0)
    with caplog.at_level(logging.WARNING, logger="megatron_rl"):
        for step in (1, 2, 3):
            metrics, samples = _flat_step()
            run.record(step, metrics, samples, task)
    said = [r.getMessage() for r in caplog.records if "learning signal" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("no learning signal for 2 steps in a row (steps 1-2)")
    assert "100% syntax_error: the code taken from the completions does not compile" in said[0]
    run.finish()
    rows = [json.loads(line) for line in (tmp_path / "flat" / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["prompt_index"]) for r in rows] == [(s, p) for s in (1, 2, 3) for p in (0, 1, 2)]
    assert rows[0]["prompt"] == "<bos>1=" and rows[0]["completion"] == "1<eos>"
    assert {(r["reward"], r["status"]) for r in rows} == {(0.0, "syntax_error")}
    assert out.said[0].splitlines()[1] == "statuses: syntax_error 100% -> 100%; grad norm 0 -> 0"


def _logged(blob: bytes, key: str) -> list[str]:
    """The values a W&B transaction log holds for history `key`: each HistoryItem is its key (field 2),
    then its value_json (field 16: tag 0x82 0x01, a length byte, the JSON)."""
    out = []
    for m in re.finditer(re.escape(key.encode()) + rb"\x82\x01(.)", blob, re.DOTALL):
        out.append(blob[m.end() : m.end() + m.group(1)[0]].decode())
    return out


def test_a_resumed_run_continues_its_wandb_run_offline_and_says_how_to_sync(tmp_path, monkeypatch):
    """Real W&B, offline: the first start's id goes into the checkpoint (`identity`), the resumed start
    continues it (one run: two folders of one id, which `wandb sync <run dir>/wandb` uploads in order)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)  # W&B's own settings folder, if it writes one
    recipe = load_recipe("grpo_tiny_cpu", ["logger.progress=false", "steps=3", "logger.no_signal_steps=0"])
    task, where = ArithmeticTask(), tmp_path / "outputs" / "mine"
    first = RunLog(recipe, where, _Console(), is_main=True, cpu_group=None)
    first.start_progress(0)
    for step in (1, 2):
        first.record(step, *_flat_step("no_code"), task)
    kept = first.identity()
    first.finish()
    wandb_id = kept["wandb_id"]
    assert kept["name"] == "mine" and wandb_id
    sync = f"wandb sync {where / 'wandb'}"
    said = first.console.said
    assert said[0] == f"W&B run {wandb_id}, offline (WANDB_MODE=offline); upload it later with: {sync}"
    assert said[-1] == f"W&B ran offline; upload it with: {sync}"

    out = _Console()
    again = RunLog(recipe, where, out, is_main=True, cpu_group=None)
    again.resumed(kept)
    again.start_progress(2)
    again.record(3, *_flat_step("no_code"), task)
    assert again.identity() == kept
    again.finish()
    assert (
        out.said[0]
        == f"W&B continues run {wandb_id}, offline (WANDB_MODE=offline); upload it later with: {sync}"
    )
    folders = sorted((where / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(f.name.endswith(f"-{wandb_id}") for f in folders), folders
    # Statuses as shares of the step's samples, every status every step (timeout: 0, never seen)
    blob = (folders[0] / f"run-{wandb_id}.wandb").read_bytes()
    assert set(_logged(blob, "reward/statuses/no_code")) == {"1"}, "16 of 16 samples: a share of 1, not 16"
    assert set(_logged(blob, "reward/statuses/timeout")) == {"0"}
    assert set(_logged(blob, "train/grad_norm")) == {"0"}
    tables = sorted((folders[0] / "files" / "media" / "table").glob("samples_*.table.json"))
    assert len(tables) == 2, "a table of the kept samples per step"
    data = json.loads(tables[0].read_text())
    assert "completion" in data["columns"] and len(data["data"]) == 4


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


def test_the_header_names_the_run_and_where_its_checkpoints_go(tmp_path):
    """The run's name is its folder in both places; with checkpoint.resume=auto a rerun of it resumes."""
    from megatron_rl.loop.record.start import header
    from megatron_rl.run.resolve import resolve

    run = resolve(load_recipe("grpo_tiny_cpu", ["steps=1", f"checkpoint.dir={tmp_path}/ckpt"]))
    lines = header(run, tmp_path / "outputs" / "mine").splitlines()
    assert lines[0].startswith("megatron-rl train grpo_tiny_cpu: 1 step of 8 prompts x 8 samples")
    assert (
        lines[3]
        == f"  run      mine: checkpoints in {tmp_path}/ckpt/mine/; a run of the same name resumes from them"
    )
    other = resolve(load_recipe("grpo_tiny_cpu", ["checkpoint.resume=none"]))
    assert header(other, tmp_path / "x").splitlines()[3].endswith("/x/"), "no resume, no promise of one"
