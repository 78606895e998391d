"""The shell side of the launch: scripts parse, and the sbatch header carries what users and Slurm need."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SBATCH = REPO / "slurm" / "train.sbatch"


@pytest.mark.parametrize(
    "script", ["slurm/train.sbatch", "launch/bootstrap.sh", "launch/torchrun.sh", "tools/slurm_local.sh"]
)
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def sbatch_options() -> dict[str, tuple[str, bool]]:
    """#SBATCH option -> (value, marked EDIT); '##SBATCH' lines are the commented-out examples."""
    found = {}
    for line in SBATCH.read_text().splitlines():
        m = re.match(r"^#(#?)SBATCH --([\w-]+)(?:=(\S+))?(.*)$", line)
        if m:
            found[m.group(2)] = (m.group(3) or "", "EDIT" in m.group(4))
    return found


def test_user_edited_lines_are_marked_and_slurm_lines_present():
    opts = sbatch_options()
    for name in ("nodes", "gpus-per-node", "ntasks-per-node", "time", "account", "partition"):
        assert opts[name][1], f"--{name} is a line users edit: mark it EDIT"
    assert opts["gpus-per-node"][0] == opts["ntasks-per-node"][0], "one task per GPU by default"
    assert opts["signal"][0] == "USR1@120", "the trainer saves on USR1 two minutes before the limit"
    assert "requeue" in opts and opts["open-mode"][0] == "append"
    assert "%j" in opts["output"][0], "one log per job"
    assert re.search(
        r"^export CONTAINER_IMAGE=\$\{CONTAINER_IMAGE:-\S*\} +# EDIT", SBATCH.read_text(), re.M
    ), "container image is marked EDIT"


def test_the_requeue_exit_code_is_the_trainers():
    from megatron_rl.system.failover import EXIT_REQUEUE

    assert f"REQUEUE_EXIT_CODE={EXIT_REQUEUE}" in SBATCH.read_text()
