"""Shapes of tests refused before scoring, and the small AST questions the planner shares.

Standard library only (it runs on the host and in the sandbox, like `testplan`). These refusals are
early, readable reasons for tests the runner could not judge; they are not what keeps wrong code from
passing (that is the proof of `proof.py`, which fails closed on whatever these miss). The list, with
its reasons, is in `testplan`'s docstring.
"""

from __future__ import annotations

import ast
import builtins
import sys

_SWALLOWS = {"Exception", "BaseException", "AssertionError"}
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TRIES = (ast.Try, *([ast.TryStar] if hasattr(ast, "TryStar") else []))
_SHAPES = (ast.Import, ast.ImportFrom, ast.Assert, ast.With, ast.AsyncWith, *_TRIES)
# The built-ins the tests' namespace has: the sandbox's interpreter runs without `site`, which adds the
# interactive helpers; the runner gives the tests `exit` and `quit` itself (testrunner.bind_solution).
BUILTINS = (frozenset(dir(builtins)) - {"copyright", "credits", "license", "help"}) | {"exit", "quit"}
RESERVED_PREFIX = "__mrl_"  # the runner's own names in the tests' namespace


class TestShapeError(ValueError):
    """The tests have a shape the runner cannot judge with certainty. The message names line and reason."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"tests line {line}: {reason}")
        self.line, self.reason = line, reason


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def walk_scope(node: ast.AST) -> list[ast.AST]:
    """Every node below `node` that runs in its scope: nested function and class bodies are not entered."""
    out: list[ast.AST] = []
    stack = [node]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            out.append(child)
            if not isinstance(child, SCOPES):
                stack.append(child)
    return out


def calls_outside_scopes(stmt: ast.stmt) -> set[str]:
    """Names of the functions a statement calls when it runs (a def or class statement calls none)."""
    if isinstance(stmt, SCOPES):
        return set()
    nodes = [stmt, *walk_scope(stmt)]
    return {n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def module_bound_names(body: list[ast.stmt], every: list[ast.AST]) -> set[str]:
    """Names these statements bind in the module's scope (function and class bodies have their own).

    `every` is every node of the file, for `global` declarations, which bind module names from inside
    functions. `from M import *` binds what the (standard-library) module M exports."""
    bound: set[str] = set()
    for stmt in body:
        # A def or class statement binds its name here; what its body binds is its own scope's.
        for node in [stmt] if isinstance(stmt, SCOPES) else [stmt, *walk_scope(stmt)]:
            if isinstance(node, (*FUNCS, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                bound.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*" and isinstance(node, ast.ImportFrom):
                        bound |= _star_names(node.module or "")
                    else:
                        bound.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
    for node in every:
        if isinstance(node, ast.Global):
            bound |= set(node.names)
    return bound


def _star_names(module: str) -> set[str]:
    """What `from module import *` binds; standard-library modules only (others are refused anyway)."""
    if module.split(".")[0] not in sys.stdlib_module_names:
        return set()
    import importlib

    try:
        mod = importlib.import_module(module)
    except Exception:  # a stdlib module this platform lacks: its import fails in the sandbox too
        return set()
    names = getattr(mod, "__all__", None)
    return {str(n) for n in (names if names is not None else [n for n in vars(mod) if not n.startswith("_")])}


def is_generator(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Yield, ast.YieldFrom)) for s in node.body for n in [s, *walk_scope(s)])  # type: ignore[attr-defined]


# ---- refusals ----------------------------------------------------------------------------------------


def refuse_unjudgeable(
    every: list[ast.AST],
    body: list[ast.stmt],
    defs: dict[str, ast.stmt],
    entry_point: str | None,
    bound: set[str],
) -> None:
    """Raise TestShapeError for the first shape of testplan's refusal list these tests have."""
    for node in every:
        if isinstance(node, ast.Name) and node.id.startswith(RESERVED_PREFIX):
            raise TestShapeError(node.lineno, f"`{node.id}` is a name the test runner reserves for itself")
        if not isinstance(node, _SHAPES):
            continue
        _refuse_import(node)
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Tuple) and node.test.elts:
            raise TestShapeError(
                node.lineno, "`assert (condition, message)` asserts a non-empty tuple, which is always true"
            )
        if isinstance(node, _TRIES):
            _refuse_swallowed_assert(node)
        if isinstance(node, (ast.With, ast.AsyncWith)) and _asserts_in(node.body):
            for item in node.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call) and dotted(expr.func).rsplit(".", 1)[-1] == "suppress":
                    raise TestShapeError(
                        node.lineno, "an assert inside `with suppress(...)`: its failure would be invisible"
                    )
    for name, node in defs.items():
        if isinstance(node, FUNCS) and name.startswith("test"):
            _refuse_test_function(node, name, method=False)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, FUNCS) and stmt.name.startswith("test"):
                    _refuse_test_function(stmt, f"{name}.{stmt.name}", method=True)
        if isinstance(node, ast.FunctionDef) and name == "check" and is_generator(node):
            raise TestShapeError(
                node.lineno, "check() is a generator: calling it would run none of its asserts"
            )
    if entry_point and entry_point in bound:
        line = next((s.lineno for s in body if entry_point in module_bound_names([s], [])), 1)
        raise TestShapeError(
            line, f"the tests bind `{entry_point}`, the name of the function under test, themselves"
        )


def _refuse_import(node: ast.AST) -> None:
    modules: list[str] = []
    if isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            raise TestShapeError(node.lineno, "a relative import: the tests run as one file, with no package")
        modules = [node.module or ""]
    for module in modules:
        top = module.split(".")[0]
        if top not in sys.stdlib_module_names and top != "__future__":
            raise TestShapeError(
                node.lineno,
                f"imports `{module}`, which is not in the standard library (the sandbox has nothing else)",
            )


def _asserts_in(stmts: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Assert) for s in stmts for n in [s, *walk_scope(s)])


def _refuse_swallowed_assert(node: ast.AST) -> None:
    if not _asserts_in(node.body):  # type: ignore[attr-defined]
        return
    for handler in node.handlers:  # type: ignore[attr-defined]
        kinds = (
            []
            if handler.type is None
            else (handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type])
        )
        catches = handler.type is None or any(dotted(k).rsplit(".", 1)[-1] in _SWALLOWS for k in kinds)
        reraises = any(isinstance(n, ast.Raise) for s in handler.body for n in [s, *walk_scope(s)])
        if catches and not reraises:
            raise TestShapeError(
                handler.lineno,
                "an assert inside `try` whose handler catches AssertionError without re-raising",
            )


def _refuse_test_function(node: ast.AST, name: str, method: bool) -> None:
    assert isinstance(node, FUNCS)
    if node.decorator_list:
        raise TestShapeError(
            node.lineno, f"test {name} is decorated; the runner cannot honour decorators on tests"
        )
    if is_generator(node):
        raise TestShapeError(
            node.lineno, f"test {name} is a generator: calling it would run none of its asserts"
        )
    a = node.args
    positional = [*a.posonlyargs, *a.args][1 if method else 0 :]
    required = len(positional) - len(a.defaults)
    if required > 0 or any(d is None for d in a.kw_defaults):
        raise TestShapeError(
            node.lineno,
            f"test {name} takes arguments that nothing supplies (pytest fixtures are not available)",
        )
