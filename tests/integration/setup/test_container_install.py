"""tools/install_container.py keeps a container's torch, for real, in a throwaway venv with stand-ins.

The venv plays an NGC container: a torch `2.14.0a0+git1234abc` (a container's own build of the release vLLM
pins) and a transformer-engine built against it are installed. A local wheelhouse (pip runs offline:
PIP_NO_INDEX; the project builds with standin_backend.py) holds stand-ins shaped like the real ones: `vllm 0.33.0` pinning `torch==2.14.0` and
`torchvision==0.29.0` (plus an ordinary dependency and an optional extra), the release `torch 2.14.0`
that pin asks for, and a `torchvision 0.29.0` built for it. The project installed is a stand-in too
(torch>=2.13,<2.15 and one dependency), so nothing is downloaded; the real packages' resolution is
tests/unit/test_packaging.py's.

First the problem: a plain `pip install vllm==0.33.0` would replace the container's torch. Then the
script: vLLM, its ordinary dependency and the project are installed, and torch and TE are the
container's, unchanged. A requirement that needs another torch stops the install instead (pip's
ResolutionImpossible), leaving torch as it was."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.launch import REPO

pytestmark = pytest.mark.slow
CONTAINER_TORCH = "2.14.0a0+git1234abc"


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel: one empty module and its metadata."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\n"
        + f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    out = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    base = tmp_path_factory.mktemp("container")
    house = base / "wheels"
    house.mkdir()
    own_torch = wheel(base, "torch", CONTAINER_TORCH)
    own_te = wheel(base, "transformer-engine", "2.11.0", ("torch",))
    wheel(house, "torch", "2.14.0")
    wheel(house, "torchvision", "0.29.0", ("torch==2.14.0",))
    wheel(house, "fakedep", "1.0")
    wheel(
        house,
        "vllm",
        "0.33.0",
        ("fakedep>=1", "torch==2.14.0", "torchvision==0.29.0", 'pandas; extra == "bench"'),
    )
    project = base / "project"
    project.mkdir()
    (project / "requires.txt").write_text("torch>=2.13,<2.15\nfakedep\n")
    shutil.copy(Path(__file__).with_name("standin_backend.py"), project / "backend.py")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(house), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", str(own_torch), str(own_te)], check=True, env=env
    )
    return python, env, project


def _run(container, *args: str) -> subprocess.CompletedProcess:
    python, env, _ = container
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)


def _version(container, name: str) -> str:
    return _run(container, "-c", f"import importlib.metadata as m; print(m.version({name!r}))").stdout.strip()


def test_a_plain_install_would_replace_the_containers_torch(container, tmp_path):
    report = tmp_path / "plain.json"
    proc = _run(container, "-m", "pip", "install", "--dry-run", "--report", str(report), "vllm==0.33.0")
    assert proc.returncode == 0, proc.stderr
    installs = {
        i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    assert installs["torch"] == "2.14.0", "pip swaps the container's build for the release vLLM pins"


def test_the_container_install_keeps_torch_and_te_and_installs_the_rest(container):
    project = str(container[2])
    dry = _run(container, "tools/install_container.py", "--dry-run", "--project", project)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"keeping torch {CONTAINER_TORCH}, transformer-engine 2.11.0" in dry.stdout
    assert _version(container, "vllm") == "", "the dry run installed nothing"

    proc = _run(container, "tools/install_container.py", "--project", project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"kept torch {CONTAINER_TORCH}" in proc.stdout
    assert (
        _version(container, "torch") == CONTAINER_TORCH
        and _version(container, "transformer-engine") == "2.11.0"
    )
    assert _version(container, "vllm") == "0.33.0" and _version(container, "fakedep") == "1.0"
    assert _version(container, "standin-rl") == "0.1.0"
    assert _version(container, "torchvision") == "", "the container's business: not installed for vLLM"


def test_a_requirement_that_needs_another_torch_stops_the_install(container, tmp_path):
    python, env, project = container
    house = Path(env["PIP_FIND_LINKS"])
    wheel(house, "needs-release-torch", "1.0", ("torch==2.14.0",))
    requires = project / "requires.txt"
    saved = requires.read_text()
    requires.write_text(saved + "needs-release-torch\n")
    try:
        proc = _run(container, "tools/install_container.py", "--project", str(project))
    finally:
        requires.write_text(saved)
    assert proc.returncode != 0 and "ResolutionImpossible" in proc.stdout + proc.stderr
    assert _version(container, "torch") == CONTAINER_TORCH
