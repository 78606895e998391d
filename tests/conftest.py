"""Session set-up shared by every tier.

The `grpo_tiny_hf_cpu` recipe names a checkpoint built on first use (`launch_local` builds it;
models/fixture.py). Tests that plan, validate or submit every shipped recipe need it readable, so it
is built once per session into a temporary folder that the recipe's `${oc.env:MEGATRON_RL_FIXTURES}`
points at (processes the tests start inherit it).

`make test` runs the suite on two pytest-xdist workers (`-n 2`): a launched run keeps about 1.2 of the
2 cores busy, so one worker alone leaves the machine 40% idle. Each worker has its own session, so the
tests of one file (module fixtures) and every reader of one shared launched run (a session fixture in
SHARED) must run on one worker. The scheduler below sends whole groups: a file, or the files that read
one shared run. A file's group is read from its source, on the controller, before any worker has
collected; every worker then checks it against the fixtures pytest resolved for each of its tests and
stops the session when the two disagree, before anything runs. (pytest-xdist's own `loadgroup` renames
`item._nodeid`, which pytest 9 no longer reads: every test was scheduled alone.)
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

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


def _one_group(groups: set[str], where: str) -> str | None:
    if len(groups) > 1:  # its worker would need the runs of both groups
        raise pytest.UsageError(
            f"{where} reads session runs of groups {sorted(groups)}: merge them in SHARED"
        )
    return next(iter(groups), None)


@functools.cache
def file_group(root: Path, path: str) -> str:
    """The group of the test file `path` (relative to `root`): the shared run that one of its functions
    (a test or a fixture) takes as a parameter, else the file itself."""
    source = root / path
    tree = (
        ast.parse(source.read_text()) if source.suffix == ".py" and source.is_file() else ast.Module([], [])
    )
    named = {
        a.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    }
    return _one_group({SHARED[f] for f in SHARED if f in named}, path) or path


def item_group(item: pytest.Item) -> str | None:
    """The shared run a collected test reads, from the fixtures pytest resolved for it."""
    return _one_group({SHARED[f] for f in getattr(item, "fixturenames", ()) if f in SHARED}, item.nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        """pytest-xdist's per-scope scheduling with the scopes of file_group."""

        def _split_scope(self, nodeid: str) -> str:
            return file_group(config.rootpath, nodeid.split("::")[0])

    return SharedRunScheduling(config, log)


def misgrouped(root: Path, items: list) -> list[str]:
    """The tests whose shared run the scheduler's file_group cannot see (read through a fixture whose
    name their file never writes as a parameter): each would send its file to a worker of its own."""
    wrong = []
    for item in items:
        shared, path = item_group(item), item.nodeid.split("::")[0]
        if shared is not None and file_group(root, path) != shared:
            wrong.append(f"{item.nodeid} reads the shared run of group {shared!r}")
    return wrong


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = misgrouped(config.rootpath, items)
    if wrong:
        raise pytest.UsageError(
            f"{wrong[0]} through a fixture whose name its file does not write as a parameter: name it in a "
            f"parameter in the file (tests/conftest.py; {len(wrong)} such tests)"
        )


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
