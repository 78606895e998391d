"""Each CPU patch is still needed (megatron-core fails without it) and still works (it passes with all).

Every case runs megatron-core in a fresh interpreter with one patch left out and records the first
stage that fails. When a megatron-core upgrade removes the need for a patch, its case starts to pass
and this test says which patch to drop; when a patch stops sufficing, the all-patches case fails. The
probes (one per process, single-threaded) run two at a time, once for the module.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

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


@pytest.fixture(scope="module")
def probes() -> dict[str, str]:
    """Each probe's output: "all" with every patch, and per patch name the probe without it."""
    cases = {"all": "all", **{n: ",".join(p.name for p in PATCHES if p.name != n) for n in NEEDED_AT}}
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(cases, pool.map(_probe, cases.values())))


def test_every_patch_has_a_case():
    assert set(NEEDED_AT) == {p.name for p in PATCHES}


def test_all_patches_run_every_stage(probes):
    out = probes["all"]
    assert "ALL OK" in out, out


@pytest.mark.parametrize("name", list(NEEDED_AT))
def test_patch_still_needed(probes, name):
    out = probes[name]
    assert "ALL OK" not in out, f"megatron-core no longer needs the {name!r} patch: remove it from cpu_compat"
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed and failed[0].split()[1] == NEEDED_AT[name], out
