"""The planner's restart from benchmarks/recovery.py's measured parts, and its refusal of a file it
cannot read as one."""

from __future__ import annotations

import json

import pytest

from megatron_rl.cli.plan import main
from megatron_rl.plan.reliability import RESTART_FIXED_S, restart_from_recovery
from megatron_rl.plan.report import build_report

MEASURED = {"detection_s": 6.4, "requeue_s": 124.0, "startup_s": 11.9, "requeue_source": "scontrol requeue"}


def test_the_restart_is_the_sum_of_the_measured_parts_and_is_used(ref):
    restart, text = restart_from_recovery(MEASURED, "r.json")
    assert restart == pytest.approx(6.4 + 124.0 + 11.9)
    assert "detection 6.4 s + requeue 124.0 s (scontrol requeue) + start-up 11.9 s" in text
    assumed = build_report(*ref, with_search=False)
    measured = build_report(*ref, with_search=False, recovery=(restart, text))
    assert (
        assumed.assumptions.restart_s == RESTART_FIXED_S and assumed.assumptions.restart_source == "assumed"
    )
    assert measured.assumptions.restart_s == restart and measured.assumptions.restart_source == text
    read = measured.reliability.checkpoint.read_s  # the modelled read stays on top of the restart
    assert measured.reliability.restart_s == pytest.approx(restart + read)
    assert measured.reliability.lost_per_failure_s < assumed.reliability.lost_per_failure_s


@pytest.mark.parametrize(
    "bad, named",
    [
        ({"requeue_s": 1.0, "startup_s": 1.0}, "detection_s=None"),
        ({**MEASURED, "startup_s": float("nan")}, "startup_s=nan"),
        ({**MEASURED, "requeue_s": -1}, "requeue_s=-1"),
        ({**MEASURED, "detection_s": True}, "detection_s=True"),
        ([1, 2], "detection_s=None"),
    ],
)
def test_a_part_that_is_not_a_measured_time_is_refused_by_name(bad, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        restart_from_recovery(bad, "r.json")


def test_the_cli_refuses_an_unreadable_file_in_one_line(tmp_path, capsys):
    broken = tmp_path / "r.json"
    broken.write_text("{not json")
    assert main(["grpo_tiny_cpu", "--no-search", "--recovery", str(broken)]) == 2
    assert f"--recovery {broken}: not readable JSON" in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text(json.dumps(MEASURED))
    assert main(["grpo_tiny_cpu", "--no-search", "--recovery", str(good)]) == 0
    assert "restart 142 s (measured (" in capsys.readouterr().out
