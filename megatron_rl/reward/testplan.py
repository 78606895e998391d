"""How a problem's tests become pass/fail units, and which shapes of tests are refused before scoring.

Standard library only: it runs on the host when problems load (`data/problems.py`) and again inside
the sandbox, in the trusted test runner, on the same source, so both sides agree on the units.

The tests are one Python file. The planner turns it into an ordered list of steps; each step is a
*test unit* (counted, passes or fails on its own, which gives partial credit) or *set-up*.

1. Every top-level statement is a step, in source order. It is a test unit when it contains an
   `assert` outside any function or class body, or when it is an expression statement that calls a
   function the tests define and that asserts (`run_checks()`, `check(candidate, verbose=False)`);
   every other statement is set-up (imports, definitions, data, prints). No statement is skipped.
2. `if __name__ == "__main__":` is the script's body: its statements are hoisted to the top level.
   `unittest.main(...)` statements are dropped: the runner runs the cases itself (rule 4).
3. `def test*()` and `async def test*()` functions that no top-level statement calls are units, run
   after the top-level steps in source order (the async ones under `asyncio.run`). A test function
   passes only if it returns None: one that returns a boolean asserts nothing.
4. `unittest.TestCase` subclasses: every `test*` method (its own or a tests-defined base's) is a unit,
   run by unittest (setUp, tearDown, subTest). It passes only if unittest ran exactly it and recorded
   no failure, error, skip, expected failure or unexpected success.
5. `def check(candidate)` (the HumanEval shape), with the problem's `entry_point`: when no top-level
   statement calls `check`, the runner calls `check(<entry_point>)`. When the call is that plain one
   and the body is flat (one positional parameter; no return, yield, global or nonlocal), the body's
   statements become steps of their own with `candidate` bound to the entry point, classified as in 1;
   otherwise the call is one unit.

The verdict, which `testrunner.run_units` applies:
- A unit passes only if it ran to completion without raising anything (SystemExit included).
- A failure anywhere in set-up fails the problem: nothing counts as passed, and no later step runs.
- The tests' own names are theirs. A name the tests bind at module level (an import, an assignment,
  a def or class, a loop target) is never taken from the solution, so a test import that fails inside
  the sandbox fails the problem rather than letting the completion's `np` answer for numpy. Only names
  the tests read and never bind come from the solution, and never those of built-ins or stdlib modules.
- Iteration-protocol exceptions count as failures, not as the end of an iteration: StopIteration and
  StopAsyncIteration raised by the solution arrive as `SolutionError`, and the `map`/`filter` the tests
  see turn a StopIteration escaping their function into RuntimeError (what PEP 479 does for
  generators), so `assert all(map(f, xs))` fails when `f` raises instead of passing on an empty `all`.

Refused when the problem loads (`TestShapeError`, with the line), never scored:
- imports outside the standard library (the sandbox has nothing else) and relative imports;
- `test*` functions and methods that take arguments nothing supplies (pytest fixtures), that carry a
  decorator (parametrize, skip, expectedFailure: the runner cannot honour them), or that are
  generators (calling one runs none of its asserts); `Test*` classes that are not unittest cases;
- `assert (x, "message")`: a non-empty tuple is always true;
- an assert inside `try` whose handler catches AssertionError (bare, Exception, BaseException,
  AssertionError) without re-raising, or inside `with suppress(...)`: its failure would be invisible;
- a function that asserts but is never called: its asserts would never run;
- tests that bind the entry point's name themselves at module level (they would test their own code),
  two top-level definitions of one test function, an `else:` on the `__main__` block, and tests with
  nothing to pass.
Problems judged by stdin/stdout pairs are not a shape of these tests: `stdio.py` runs and judges them.
"""

from __future__ import annotations

import ast
import base64
import marshal
import sys
from dataclasses import dataclass
from types import CodeType

# The statements the runner adds; their helpers are injected into the tests' namespace by testrunner.
RUN_TEST = "__run_test__"
RUN_CASE = "__run_case__"
_SWALLOWS = {"Exception", "BaseException", "AssertionError"}
_CASE_BASES = {"TestCase", "IsolatedAsyncioTestCase"}
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_TRIES = (ast.Try, *([ast.TryStar] if hasattr(ast, "TryStar") else []))
_SHAPES = (ast.Import, ast.ImportFrom, ast.Assert, ast.With, ast.AsyncWith, *_TRIES)  # what refusals inspect


class TestShapeError(ValueError):
    """The tests have a shape the runner cannot judge with certainty. The message names line and reason."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"tests line {line}: {reason}")
        self.line, self.reason = line, reason


@dataclass
class Unit:
    code: CodeType
    is_test: bool
    label: str  # the source line, for failure messages
    line: int


@dataclass
class TestPlan:
    __test__ = False  # not a pytest class, despite the name
    units: list[Unit]
    names: set[str]  # names the tests read and never bind: only these may come from the solution
    candidate: str | None  # the name `check`'s parameter binds to the entry point, when its body is split

    @property
    def total(self) -> int:
        return sum(u.is_test for u in self.units)


def plan_tests(source: str, entry_point: str | None) -> TestPlan:
    """Split test source into set-up and test units. Raises SyntaxError, or TestShapeError (a ValueError)."""
    tree = ast.parse(source, "<tests>")
    every = list(ast.walk(tree))
    body = _hoist_main(tree.body)
    defs = _top_level_defs(body)
    bound = _module_bound_names(body, every)
    _refuse_unjudgeable(every, body, defs, entry_point, bound)
    asserting = _asserting_functions(defs)
    called = {n for s in body for n in _calls_outside_scopes(s)}
    steps: list[Unit] = []
    candidate = None
    check = defs.get("check")
    split_check = False
    if isinstance(check, ast.FunctionDef) and "check" in asserting:
        if not entry_point:
            raise TestShapeError(
                check.lineno, "the tests define check(candidate) but the problem names no entry_point"
            )
        explicit = [s for s in body if "check" in _calls_outside_scopes(s)]
        plain = not explicit or (len(explicit) == 1 and _is_plain_call(explicit[0], "check", entry_point))
        split_check = plain and _flat_check(check)
        if not explicit and not split_check:
            _require_one_argument(check)
    for stmt in body:
        if split_check and "check" in _calls_outside_scopes(stmt):
            continue  # replaced by check's own statements, below
        steps.append(_unit(source, stmt, _is_test_statement(stmt, asserting)))
    if split_check:
        assert isinstance(check, ast.FunctionDef)
        candidate = check.args.args[0].arg
        steps += [_unit(source, s, _is_test_statement(s, asserting)) for s in check.body]
    elif isinstance(check, ast.FunctionDef) and "check" not in called and "check" in asserting:
        steps.append(_added(f"check({entry_point})", check.lineno, f"check({entry_point})"))
    for name, node in defs.items():
        if name.startswith("test") and isinstance(node, _FUNCS) and name not in called:
            steps.append(_added(f"{RUN_TEST}({name})", node.lineno, f"{name}()"))
    for cls, methods in _test_cases(defs).items():
        for method, line in methods:
            steps.append(_added(f"{RUN_CASE}({cls}, {method!r})", line, f"{cls}.{method}"))
    if split_check:
        assert isinstance(check, ast.FunctionDef)
        bound |= _module_bound_names(check.body, [])
    names = _read_names(every) - bound
    if isinstance(check, ast.FunctionDef) and entry_point:
        names.add(entry_point)
    plan = TestPlan(steps, names, candidate)
    if plan.total == 0:
        raise TestShapeError(
            1, "the tests contain no assert, no test function and no unittest case: nothing to pass"
        )
    return plan


def plan_to_wire(plan: TestPlan) -> dict:
    """The plan as JSON-able data, code objects marshalled: the host plans once per problem, and the
    test runner in the sandbox (same interpreter binary) loads it instead of parsing the tests again."""
    units = [
        [base64.b64encode(marshal.dumps(u.code)).decode(), u.is_test, u.label, u.line] for u in plan.units
    ]
    return {"units": units, "names": sorted(plan.names), "candidate": plan.candidate}


def plan_from_wire(data: dict) -> TestPlan:
    """The inverse of `plan_to_wire`. Only for data from the host: unmarshalling trusts its input."""
    units = [
        Unit(marshal.loads(base64.b64decode(c)), bool(t), str(label), int(line))
        for c, t, label, line in data["units"]
    ]
    return TestPlan(units, set(data["names"]), data["candidate"])


# ---- building units ----------------------------------------------------------------------------------


def _unit(source: str, stmt: ast.stmt, is_test: bool) -> Unit:
    try:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), "<tests>", "exec")
    except SyntaxError as e:  # `return` or `yield` outside a function
        raise TestShapeError(stmt.lineno, f"{e.msg}") from None
    text = ast.get_source_segment(source, stmt) or ast.dump(stmt)[:120]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return Unit(code, is_test, first[:160], stmt.lineno)


def _added(code: str, line: int, label: str) -> Unit:
    return Unit(compile(code, f"<tests:{label}>", "exec"), True, label, line)


def _hoist_main(body: list[ast.stmt]) -> list[ast.stmt]:
    """The `__main__` block's statements in its place; `unittest.main(...)` statements dropped."""
    out: list[ast.stmt] = []
    for stmt in body:
        if _is_main_guard(stmt):
            assert isinstance(stmt, ast.If)
            if stmt.orelse:
                raise TestShapeError(stmt.lineno, "the `if __name__ == '__main__':` block has an else branch")
            out += _hoist_main(stmt.body)
        elif not _is_unittest_main(stmt):
            out.append(stmt)
    return out


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    t = stmt.test
    sides = [t.left, *t.comparators]
    return (
        len(t.ops) == 1
        and isinstance(t.ops[0], ast.Eq)
        and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
        and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    )


def _is_unittest_main(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    f = stmt.value.func
    return isinstance(f, ast.Attribute) and f.attr == "main" and _dotted(f.value) == "unittest"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _top_level_defs(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for stmt in body:
        if isinstance(stmt, (*_FUNCS, ast.ClassDef)):
            if stmt.name in defs and (stmt.name.startswith(("test", "Test")) or stmt.name == "check"):
                raise TestShapeError(
                    stmt.lineno, f"`{stmt.name}` is defined twice: which one is meant is unclear"
                )
            defs[stmt.name] = stmt
    return defs


def _walk_scope(node: ast.AST) -> list[ast.AST]:
    """Every node below `node` that runs in its scope: nested function and class bodies are not entered."""
    out: list[ast.AST] = []
    stack = [node]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            out.append(child)
            if not isinstance(child, _SCOPES):
                stack.append(child)
    return out


def _calls_outside_scopes(stmt: ast.stmt) -> set[str]:
    """Names of the functions a statement calls when it runs (a def or class statement calls none)."""
    if isinstance(stmt, _SCOPES):
        return set()
    nodes = [stmt, *_walk_scope(stmt)]
    return {n.func.id for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _asserting_functions(defs: dict[str, ast.stmt]) -> set[str]:
    """Top-level functions that assert, directly or through other such functions (a fixpoint)."""
    funcs = {name: node for name, node in defs.items() if isinstance(node, _FUNCS)}
    calls = {
        name: {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for name, node in funcs.items()
    }
    found = {name for name, node in funcs.items() if any(isinstance(n, ast.Assert) for n in ast.walk(node))}
    while True:
        more = {name for name in funcs if name not in found and calls[name] & found}
        if not more:
            return found
        found |= more


def _is_test_statement(stmt: ast.stmt, asserting: set[str]) -> bool:
    if isinstance(stmt, _SCOPES):
        return False
    if isinstance(stmt, ast.Assert) or any(isinstance(n, ast.Assert) for n in _walk_scope(stmt)):
        return True
    return isinstance(stmt, ast.Expr) and bool(_calls_outside_scopes(stmt) & asserting)


def _is_plain_call(stmt: ast.stmt, func: str, arg: str) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    return (
        isinstance(call.func, ast.Name)
        and call.func.id == func
        and not call.keywords
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id == arg
    )


def _flat_check(check: ast.FunctionDef) -> bool:
    a = check.args
    if check.decorator_list or len(a.args) != 1 or a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg:
        return False
    banned = (ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal, ast.Await)
    return not any(isinstance(n, banned) for s in check.body for n in [s, *_walk_scope(s)])


def _require_one_argument(func: ast.FunctionDef) -> None:
    a = func.args
    required = len(a.posonlyargs) + len(a.args) - len(a.defaults)
    if (
        required > 1
        or any(d is None for d in a.kw_defaults)
        or (required == 0 and not a.vararg and not a.args)
    ):
        raise TestShapeError(func.lineno, "check() must take the entry point as its one required argument")


def _test_cases(defs: dict[str, ast.stmt]) -> dict[str, list[tuple[str, int]]]:
    """unittest.TestCase subclasses the tests define, and the test methods of each (with inherited ones)."""
    classes = {name: node for name, node in defs.items() if isinstance(node, ast.ClassDef)}

    def is_case(node: ast.ClassDef, seen: frozenset = frozenset()) -> bool:
        for base in node.bases:
            name = _dotted(base).rsplit(".", 1)[-1]
            if name in _CASE_BASES or (
                name in classes and name not in seen and is_case(classes[name], seen | {name})
            ):
                return True
        return False

    def methods(node: ast.ClassDef, seen: frozenset = frozenset()) -> dict[str, int]:
        found: dict[str, int] = {}
        for base in node.bases:
            name = _dotted(base)
            if name in classes and name not in seen:
                found.update(methods(classes[name], seen | {name}))
        for stmt in node.body:
            if isinstance(stmt, _FUNCS) and stmt.name.startswith("test"):
                found[stmt.name] = stmt.lineno
        return found

    out = {}
    for name, node in classes.items():
        if is_case(node):
            found = methods(node)
            if found:
                out[name] = sorted(found.items(), key=lambda kv: kv[1])
        elif name.startswith("Test") and any(
            isinstance(s, _FUNCS) and s.name.startswith("test") for s in node.body
        ):
            raise TestShapeError(node.lineno, f"class {name} has test methods but is not a unittest.TestCase")
    return out


# ---- names -------------------------------------------------------------------------------------------


def _read_names(every: list[ast.AST]) -> set[str]:
    return {n.id for n in every if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _module_bound_names(body: list[ast.stmt], every: list[ast.AST]) -> set[str]:
    """Names these statements bind in the module's scope (function and class bodies have their own).

    `every` is every node of the file, for `global` declarations, which bind module names from inside
    functions."""
    bound: set[str] = set()
    for stmt in body:
        nodes = [stmt, *_walk_scope(stmt)]
        for node in nodes:
            if isinstance(node, (*_FUNCS, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                bound.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
    for node in every:
        if isinstance(node, ast.Global):
            bound |= set(node.names)
    return bound


# ---- refusals ----------------------------------------------------------------------------------------


def _refuse_unjudgeable(
    every: list[ast.AST],
    body: list[ast.stmt],
    defs: dict[str, ast.stmt],
    entry_point: str | None,
    bound: set[str],
) -> None:
    for node in every:
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
                if isinstance(expr, ast.Call) and _dotted(expr.func).rsplit(".", 1)[-1] == "suppress":
                    raise TestShapeError(
                        node.lineno, "an assert inside `with suppress(...)`: its failure would be invisible"
                    )
    for name, node in defs.items():
        if isinstance(node, _FUNCS) and name.startswith("test"):
            _refuse_test_function(node, name, method=False)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, _FUNCS) and stmt.name.startswith("test"):
                    _refuse_test_function(stmt, f"{name}.{stmt.name}", method=True)
        if isinstance(node, ast.FunctionDef) and name == "check" and _is_generator(node):
            raise TestShapeError(
                node.lineno, "check() is a generator: calling it would run none of its asserts"
            )
    if entry_point and entry_point in bound:
        line = next((s.lineno for s in body if entry_point in _module_bound_names([s], [])), 1)
        raise TestShapeError(
            line, f"the tests bind `{entry_point}`, the name of the function under test, themselves"
        )
    read = _read_names(every)
    for name, node in defs.items():
        if isinstance(node, _FUNCS) and not name.startswith("test") and name != "check" and name not in read:
            if _asserts_in(node.body):
                raise TestShapeError(
                    node.lineno, f"`{name}` asserts but is never called: its asserts would never run"
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
    return any(isinstance(n, ast.Assert) for s in stmts for n in [s, *_walk_scope(s)])


def _refuse_swallowed_assert(node: ast.AST) -> None:
    if not _asserts_in(node.body):  # type: ignore[attr-defined]
        return
    for handler in node.handlers:  # type: ignore[attr-defined]
        kinds = (
            []
            if handler.type is None
            else (handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type])
        )
        catches = handler.type is None or any(_dotted(k).rsplit(".", 1)[-1] in _SWALLOWS for k in kinds)
        reraises = any(isinstance(n, ast.Raise) for s in handler.body for n in [s, *_walk_scope(s)])
        if catches and not reraises:
            raise TestShapeError(
                handler.lineno,
                "an assert inside `try` whose handler catches AssertionError without re-raising",
            )


def _is_generator(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Yield, ast.YieldFrom)) for s in node.body for n in [s, *_walk_scope(s)])  # type: ignore[attr-defined]


def _refuse_test_function(node: ast.AST, name: str, method: bool) -> None:
    assert isinstance(node, _FUNCS)
    if node.decorator_list:
        raise TestShapeError(
            node.lineno, f"test {name} is decorated; the runner cannot honour decorators on tests"
        )
    if _is_generator(node):
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
