"""The collective guard catches a host tensor on a device group wherever it is made (2 ranks, gloo).

Checkpointer._check_space all-reduced a host tensor on the default group: on GPU (NCCL) the first
checkpoint save died "No backend type associated with device type cpu", and the guard let it pass
because it came from checkpoint code, outside the trainer's modules (trainer/device_guard.py).
"""

import json

import pytest

from tests.helpers.launch import torchrun

pytestmark = pytest.mark.slow
WORKER = "tests/dist/trainer/worker_host_collectives.py"


def test_host_tensors_on_the_default_group_fail_under_the_guard_wherever_made(tmp_path):
    proc = torchrun(WORKER, 2, [str(tmp_path)], timeout=300, env={"MEGATRON_RL_DEVICE_GUARD": "1"})
    out = json.loads(
        next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")).removeprefix("RESULT ")
    )
    for case in ("pre_fix", "derived", "host_copy", "bare"):
        assert out[case].startswith("DeviceDisciplineError") and "host tensor" in out[case], (case, out[case])
    assert out["fixed"] == "ok" and out["fixed_total"] == 200
    assert out["pre_fix_on_cpu_group"] == "ok"
