"""Each CPU patch is still needed (megatron-core fails without it) and still works (it passes with all).

Every case runs megatron-core in a fresh interpreter with one patch left out and records the first
stage that fails. When a megatron-core upgrade removes the need for a patch, its case starts to pass
and this test says which patch to drop; when a patch stops sufficing, the all-patches case fails.
"""

import os
import subprocess
import sys

import pytest

from megatron_rl.trainer.cpu_compat import PATCHES
from tests.helpers.launch import REPO, free_port

pytestmark = pytest.mark.slow
PROBE = REPO / "tests/dist/trainer/probe_cpu_compat.py"
# The first stage that must fail without each patch.
NEEDED_AT = {
    "rng": "seed",
    "current_device": "build",
    "cuda_literal": "build",
    "synchronize": "dist_checkpointing",
    "tensor_type": "build",
    "event": "event",
    "optimizer_step_state": "optimizer_checkpoint",
    "moe_router_gemm": "moe",
}


def _probe(patches: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MASTER_PORT": str(free_port())}
    proc = subprocess.run(
        [sys.executable, str(PROBE), patches], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )
    return proc.stdout


def test_every_patch_has_a_case():
    assert set(NEEDED_AT) == {p.name for p in PATCHES}


def test_all_patches_run_every_stage():
    out = _probe("all")
    assert "ALL OK" in out, out


@pytest.mark.parametrize("name", list(NEEDED_AT))
def test_patch_still_needed(name):
    others = ",".join(p.name for p in PATCHES if p.name != name)
    out = _probe(others)
    assert "ALL OK" not in out, f"megatron-core no longer needs the {name!r} patch: remove it from cpu_compat"
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed and failed[0].split()[1] == NEEDED_AT[name], out
