"""Session set-up shared by every tier.

The `grpo_tiny_hf_cpu` recipe names a checkpoint built on first use (`launch_local` builds it;
models/fixture.py). Tests that plan, validate or submit every shipped recipe need it readable, so it
is built once per session into a temporary folder that the recipe's `${oc.env:MEGATRON_RL_FIXTURES}`
points at (processes the tests start inherit it).

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`): a launched run keeps
about 1.2 of the 2 cores busy, so one worker alone leaves the machine 40% idle. Each worker has its own
session, so tests that share a launched run (a session fixture) or a module's run stay on one worker:
`pytest_collection_modifyitems` puts every test in the group of its file, and the readers of one shared
session fixture in that fixture's group (SHARED).
"""

from __future__ import annotations

import os

import pytest

# Session fixtures that launch something expensive -> the group of every test that reads one (a second
# worker reading it would launch it again; `slurm` would start a second cluster).
SHARED = {
    "tiny_run": "loop-runs",
    "engine_run": "loop-runs",
    "verbose_oversampled_run": "loop-runs",
    "uninterrupted": "resume-runs",
    "slurm": "slurm",
}


def xdist_group_of(item: pytest.Item) -> str:
    """The group a test runs in: its shared session fixture's, else its file's (module fixtures)."""
    used = set(getattr(item, "fixturenames", ()))
    shared = sorted({group for name, group in SHARED.items() if name in used})
    if len(shared) > 1:  # one test reading runs of two groups would need both on its worker
        raise pytest.UsageError(f"{item.nodeid} reads session runs of groups {shared}: merge them in SHARED")
    return shared[0] if shared else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))


@pytest.fixture(scope="session", autouse=True)
def hf_fixtures(tmp_path_factory):
    from megatron_rl.models.fixture import build_fixture

    root = tmp_path_factory.mktemp("fixtures")
    previous = os.environ.get("MEGATRON_RL_FIXTURES")
    os.environ["MEGATRON_RL_FIXTURES"] = str(root)
    build_fixture("qwen2", root / "qwen2")
    yield root
    if previous is None:
        os.environ.pop("MEGATRON_RL_FIXTURES", None)
    else:
        os.environ["MEGATRON_RL_FIXTURES"] = previous
