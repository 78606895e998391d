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
