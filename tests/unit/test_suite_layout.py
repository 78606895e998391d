"""`pytest tests` (what `make test` runs) collects every tier: no folder under tests/ matches a pattern
of pytest's `norecursedirs` (its default one, "dist", had silently left tests/dist out of the suite)."""

import fnmatch
import tomllib

from tests.helpers.launch import REPO

# pytest's own default, in force when pyproject.toml sets none
PYTEST_DEFAULT = ["*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}"]


def test_no_test_folder_is_skipped_by_norecursedirs():
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    patterns = options.get("norecursedirs", PYTEST_DEFAULT)
    folders = [p for p in (REPO / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"]
    assert {"unit", "dist", "integration", "gpu"} <= {p.name for p in folders}
    skipped = [p for p in folders if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    assert skipped == [], skipped


def test_readers_of_one_launched_run_share_a_worker_and_others_keep_their_file(tmp_path):
    """make test's two workers (tests/conftest.py): a second worker reading a shared session run would
    launch it again; a file's tests stay together for its module fixtures."""
    import pytest

    from tests.conftest import SHARED, file_group

    def group(name: str, source: str) -> str:
        (tmp_path / name).write_text(source)
        return file_group(tmp_path, name)

    assert group("a.py", "def test_x(tiny_run):\n    pass\n") == "loop-runs"
    assert group(
        "b.py", "@pytest.fixture\ndef runs(\n    tiny_run,\n    verbose_oversampled_run,\n):\n    pass\n"
    ) == ("loop-runs")
    assert group("c.py", "def test_x(uninterrupted, tmp_path): ...") == "resume-runs"
    assert (
        group("d.py", "def test_x(tmp_path):\n    '''def test_y(tiny_run): a string is no parameter'''\n")
        == "d.py"
    )
    with pytest.raises(pytest.UsageError, match="merge them in SHARED"):
        group("e.py", "def test_x(tiny_run): ...\ndef test_y(uninterrupted): ...")
    assert {"tiny_run", "engine_run", "verbose_oversampled_run", "uninterrupted", "slurm"} <= set(SHARED)
    # The shipped readers, as the scheduler groups them.
    assert file_group(REPO, "tests/integration/loop/test_console_and_report.py") == "loop-runs"
    assert file_group(REPO, "tests/integration/loop/test_old_logprobs.py") == "loop-runs"
    assert file_group(REPO, "tests/integration/checkpoint/test_resume_integrity.py") == "resume-runs"
    assert file_group(REPO, "tests/integration/slurm/test_slurm_train.py") == "slurm"
    assert file_group(REPO, "tests/unit/plan/test_search.py") == "tests/unit/plan/test_search.py"


def test_every_session_run_the_integration_tier_launches_is_shared():
    """A new session fixture in an integration conftest.py joins SHARED, or two workers launch it."""
    import re

    from tests.conftest import SHARED

    declared = set()
    for conftest in [
        *(REPO / "tests" / "integration").rglob("conftest.py"),
        *(REPO / "tests" / "dist").rglob("conftest.py"),
    ]:
        declared |= set(
            re.findall(r'@pytest\.fixture\(scope="session"\)\s*\ndef (\w+)', conftest.read_text())
        )
    assert declared and declared <= set(SHARED), declared - set(SHARED)


def test_a_reader_the_file_scan_cannot_see_stops_the_session(tmp_path):
    """The scheduler groups by file source; pytest resolves fixtures through conftest chains the source
    need not name. A test reading `tiny_run` through a conftest fixture of another name is caught."""
    from types import SimpleNamespace

    from tests.conftest import misgrouped

    (tmp_path / "test_hidden.py").write_text("def test_x(runs):\n    pass\n")
    (tmp_path / "test_named.py").write_text("def test_x(tiny_run):\n    pass\n")
    hidden = SimpleNamespace(nodeid="test_hidden.py::test_x", fixturenames=["runs", "tiny_run"])
    named = SimpleNamespace(nodeid="test_named.py::test_x", fixturenames=["tiny_run"])
    alone = SimpleNamespace(nodeid="test_hidden.py::test_y", fixturenames=["tmp_path"])
    assert misgrouped(tmp_path, [named, alone]) == []
    assert misgrouped(tmp_path, [hidden, named]) == [
        "test_hidden.py::test_x reads the shared run of group 'loop-runs'"
    ]
