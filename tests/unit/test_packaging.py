"""The `gpu` extra resolves: `pip install -e '.[gpu]'` (what the README and the engine's error say)
must find one set of versions, and inside a torch 2.14 container `pip install -e .` must not ask
for another torch.

Resolution only (`uv pip compile`, package metadata, nothing installed; ~10 s). Skipped, with the
reason, when uv is missing or the package index cannot be reached; an unsatisfiable set fails.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What uv prints when it cannot reach the index (as opposed to "No solution found").
NETWORK_ERRORS = ("Failed to fetch", "error sending request", "dns error", "Could not connect", "timed out")


def _compile(tmp_path: Path, *args: str) -> dict[str, str]:
    uv = shutil.which("uv") or str(Path(__import__("sys").executable).parent / "uv")
    if not Path(uv).exists():
        pytest.skip("uv is not installed (it comes with the test extra / requirements/cpu.lock)")
    cmd = [
        uv, "pip", "compile", str(REPO / "pyproject.toml"), *args,
        "--python-version", "3.11", "--python-platform", "x86_64-unknown-linux-gnu",
        "--no-header", "--no-annotate", "--cache-dir", str(tmp_path / "uv-cache"),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.skip("the package index did not answer within 120 s")
    if proc.returncode != 0:
        if any(e in proc.stderr for e in NETWORK_ERRORS) and "No solution found" not in proc.stderr:
            pytest.skip(f"package index unreachable: {proc.stderr.strip().splitlines()[-1][:200]}")
        pytest.fail(f"`{' '.join(cmd[1:4])} ...` found no solution:\n{proc.stderr[-3000:]}")
    pins = {}
    for line in proc.stdout.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def test_the_gpu_extra_resolves_with_the_torch_vllm_needs(tmp_path):
    pins = _compile(tmp_path, "--extra", "gpu")
    assert pins["vllm"] == "0.33.0"
    assert pins["torch"].startswith("2.14."), pins["torch"]
    assert pins["megatron-core"] == "0.16.1"
    assert "transformer-engine" in pins


def test_a_torch_2_14_container_keeps_its_torch(tmp_path):
    constraints = tmp_path / "container.txt"
    constraints.write_text("torch==2.14.0\n")
    pins = _compile(tmp_path, "--constraint", str(constraints))
    assert pins["torch"] == "2.14.0"


def test_the_cpu_venv_torch_is_still_allowed(tmp_path):
    constraints = tmp_path / "cpu.txt"
    constraints.write_text("torch==2.13.0\n")
    assert _compile(tmp_path, "--constraint", str(constraints))["torch"] == "2.13.0"


def test_the_gpu_extra_pins_transformer_engine_inside_megatron_cores_tested_range():
    """megatron-core 0.16.1 states the TE it is tested with in its own metadata (its `dev` extra); the gpu
    extra must stay inside it (unpinned, pip resolved TE 2.20.2, whose PyTorch module is a source build)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    from megatron_rl.system.machine import TE_INSTALL, requirement_of

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (ours,) = [Requirement(r) for r in extra if Requirement(r).name == "transformer-engine"]
    tested = requirement_of("megatron-core", "transformer-engine", extra="dev")
    assert tested == "<2.12.0,>=2.9.0a0", "megatron-core's own tested range"
    for v in ("2.8.0", "2.9.0", "2.10.0", "2.11.0", "2.12.0", "2.20.2"):
        assert ours.specifier.contains(Version(v)) == Requirement(f"te{tested}").specifier.contains(
            Version(v)
        ), v
    assert {"pytorch", "core_cu13"} <= ours.extras
    assert Requirement(TE_INSTALL.split('"')[1]) == ours, "the install line the doctor and the model print"
