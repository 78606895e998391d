"""The package's import graph against its declared architecture: imports flow down only.

Layers, bottom first; a module may import its own package and the packages of lower layers, never a
package of its own layer or above (every import counts: module level, inside functions, and
`TYPE_CHECKING` blocks, which name a dependency as surely as an import does). Within a package, the
modules' imports form no circle. A new package must be placed in `LAYERS` before anything imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_rl"

LAYERS: list[tuple[str, ...]] = [
    ("config",),  # the recipe's schema, its names and how it loads: imports nothing of ours
    ("parallel", "telemetry", "system"),  # rank arithmetic; phase records; what this machine has
    ("algorithms", "reward"),  # pure tensor functions; grading in the sandbox
    ("data",),  # where problems and prompts come from
    ("models",),  # architectures, names, dtypes, checkpoints
    ("env",),  # multi-turn environments: text in, observation and reward out
    ("rollout", "trainer", "reshard", "checkpoint"),  # engines; the megatron-core trainer; publication
    ("run",),  # a recipe resolved once into what a run is
    ("plan",),  # the capacity planner
    ("check",),  # the one recipe check
    ("loop",),  # the pieces of a step that need several components
    ("train", "cli"),  # the driver and the commands
]
LAYER = {pkg: i for i, names in enumerate(LAYERS) for pkg in names}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every megatron_rl module `path` imports, wherever the import stands."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("megatron_rl"):
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("megatron_rl"))
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {d for d in _imports(p) if d in files and d != m} for m, p in files.items()}


def _package(module: str) -> str:
    return module.split(".")[1] if module != "megatron_rl" else ""


GRAPH = _graph()


def test_every_package_has_a_layer():
    packages = {_package(m) for m in GRAPH} - {""}
    assert packages <= set(LAYER), f"place these in LAYERS: {sorted(packages - set(LAYER))}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_flow_down(module):
    mine = _package(module)
    up = [
        d for d in GRAPH[module] if _package(d) != mine and LAYER.get(_package(d), -1) >= LAYER.get(mine, 99)
    ]
    assert not up, f"{module} imports {sorted(up)}: at or above its layer ({LAYERS[LAYER[mine]]})"


def test_no_module_circle():
    seen: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        path.append(m)
        for d in sorted(GRAPH[m]):
            if seen.get(d) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(d) :] + [d]))
            if d not in seen:
                visit(d)
        path.pop()
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m)


def test_the_algorithms_and_the_check_import_no_torch():
    """Pure algorithms load their tensor functions lazily; the check and the planner never need torch."""
    import subprocess
    import sys

    code = (
        "import sys, megatron_rl.check.recipe, megatron_rl.plan.cycle, megatron_rl.algorithms.names; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
