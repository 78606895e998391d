"""How a problem's tests become pass/fail units, and which shapes of tests are refused before scoring.

Standard library only: it runs on the host when problems load (`data/problems.py`) and its plan runs
in the sandbox, in the trusted test runner, so both sides agree on the units.

The tests are one Python file. The planner turns it into an ordered list of steps; a step is *set-up*,
a *test unit* (counted, passes or fails on its own, which gives partial credit), or the call of a split
`check` (rule 5) that runs units inside it. An *assertion site* is an `assert` statement or a call of an
assertion method (`self.assertEqual(...)`, `self.fail()`: `assertsites`).

1. Every top-level statement is a step, in source order. It is a test unit when it holds an assertion
   site outside any function or class body, or when it calls a function of the tests that asserts
   (directly or through other such functions): `run_checks()`, `for x in f(3): check_one(x)`. Every
   other statement is set-up (imports, definitions, data, prints). No statement is skipped.
2. `if __name__ == "__main__":` is the script's body: its statements are hoisted to the top level.
   `unittest.main(...)` statements are dropped: the runner runs the cases itself (rule 4).
3. `def test*()` and `async def test*()` functions that no top-level statement calls are units, run
   after the top-level steps in source order (the async ones under `asyncio.run`). A test function
   passes only if it returns None.
4. `unittest.TestCase` (or `IsolatedAsyncioTestCase`) subclasses, the base named as imported, under an
   alias, or through a tests-defined base: every `test*` method is a unit, run by unittest (setUp,
   tearDown, subTest). It passes only if unittest ran exactly it and recorded no failure, error, skip,
   expected failure or unexpected success.
5. `def check(candidate)` (the HumanEval shape), with the problem's entry point: when no top-level
   statement calls `check`, the runner calls `check(<entry_point>)` after the top-level steps. When the
   call is that plain one and the body flat (one positional parameter; no return, yield, await,
   global or nonlocal), each statement of the body that holds a site or calls an asserting function
   is a unit of its own, run in check's own frame (its locals stay its own, as in Python); one that
   fails is recorded and the next statement runs. Otherwise the call is one unit.
6. Names. A name the tests read resolves to, in this order: what the tests bind at module level; what
   the problem's code binds (`prefix`: HumanEval's prompt, APPS's starter code), which the runner runs
   first (only when the tests read a name from it); a built-in; a standard-library module (imported by
   the runner); or the entry point, which comes from the solution, as do the further names the problem
   declares as its interface (MBPP's classes that the tests construct, `Pair`, `Node`: `public.py`).
   With no entry point given, the one name the tests read that none of the others binds is the entry
   point. A solution's other names, its `MOD`, its own `check` or `exit`, never reach the tests.

The verdict, which `testrunner.run_units` applies with `proof.Recorder`: a unit passes only when it ran
to the end without raising (SystemExit included), no AssertionError passed through the tests' own code
while it ran (even if caught), every site that started held each time, each site inside the unit's own
code ran, at least one site ran, and each site the unit reaches by name (a helper, a method) ran at
least once in the whole run. The solution's missing entry point fails every unit before any runs. A
failure anywhere in set-up fails the problem: nothing counts as passed, and no later step runs.
Iteration-protocol exceptions count as failures, not as the end of an iteration: StopIteration and
StopAsyncIteration raised by the solution arrive as `SolutionError`, and the `map`/`filter` the tests
see turn a StopIteration escaping their function into RuntimeError (what PEP 479 does for generators).

Refused when the problem loads (`TestShapeError`, with the line), never scored:
- imports outside the standard library (the sandbox has nothing else) and relative imports;
- `test*` functions and methods that take arguments nothing supplies (pytest fixtures), that carry a
  decorator (parametrize, skip, expectedFailure: the runner cannot honour them), or that are
  generators (calling one runs none of its asserts); `Test*` classes that are not unittest cases;
- `assert (x, "message")`: a non-empty tuple is always true;
- an assert inside `try` whose handler catches AssertionError (bare, Exception, BaseException,
  AssertionError) without re-raising, or inside `with suppress(...)` (the proof would fail it anyway;
  this says why at load);
- a name the tests read that rule 6 cannot resolve; tests that bind the entry point's name themselves
  (they would test their own code); names the runner reserves (`__mrl_...`);
- an assertion no test runs: in a helper no unit reaches and no set-up statement calls, in a method
  added with `setattr`, in a test method under a class-level `if`;
- a test function or method with no assertion anywhere in its reach (one that returns its verdict);
- two top-level definitions of one test function, an `else:` on the `__main__` block, and tests with
  nothing to pass.
Problems judged by stdin/stdout pairs are not a shape of these tests: `stdio.py` runs and judges them.
"""

from __future__ import annotations

import ast
import base64
import marshal
import sys
from types import CodeType
from typing import NamedTuple

from megatron_rl.reward.assertsites import Reach, Sites, preorder
from megatron_rl.reward.proof import UNIT
from megatron_rl.reward.testshape import (
    BUILTINS,
    FUNCS,
    SCOPES,
    TestShapeError,
    calls_outside_scopes,
    dotted,
    module_bound_names,
    refuse_unjudgeable,
    walk_scope,
)

__all__ = ["RUN_CASE", "RUN_TEST", "Step", "TestPlan", "TestShapeError", "Unit", "plan_tests"]

# The statements the runner adds; their helpers are injected into the tests' namespace by testrunner.
RUN_TEST = "__mrl_run_test__"
RUN_CASE = "__mrl_run_case__"
_CASE_BASES = {"TestCase", "IsolatedAsyncioTestCase"}
_FLAGS = {"dont_inherit": True, "optimize": 0}  # this module's own __future__ flags, or -O, must not leak


class Step(NamedTuple):
    """What the runner execs, in order: set-up, one unit, or the call of a split check (kind "check")."""

    code: CodeType
    kind: str  # "setup" | "unit" | "check"
    unit: int  # the unit's index for kind "unit", else -1
    label: str  # the source line, for failure messages
    line: int


class Unit(NamedTuple):
    label: str
    line: int
    lexical: frozenset[int]  # sites that must each start during the unit
    attributed: frozenset[int]  # sites it reaches by name: each must start at least once in the run


class TestPlan(NamedTuple):
    __test__ = False  # not a pytest class, despite the name
    steps: list[Step]
    units: list[Unit]
    site_lines: list[int]
    entry_point: str | None  # given, or inferred (rule 6)
    prefix: CodeType | None  # the problem's code, run first, when the tests read a name only it binds
    imports: list[str]  # standard-library modules the tests read without importing them
    interface: list[str]  # the solution's further names the problem declares (rule 6)

    @property
    def solution_names(self) -> list[str]:
        """Every name the tests take from the solution: the entry point and the declared interface."""
        return [n for n in [self.entry_point, *self.interface] if n]

    @property
    def total(self) -> int:
        return len(self.units)


def plan_tests(
    source: str, entry_point: str | None, prefix: str = "", interface: tuple[str, ...] | list[str] = ()
) -> TestPlan:
    """Plan test source (see the module docstring). `interface`: further names of the solution the
    problem declares (MBPP's `Pair`, rule 6). Raises SyntaxError, or TestShapeError (a ValueError)."""
    tree = ast.parse(source, "<tests>")
    every = list(ast.walk(tree))
    body = _hoist_main(tree.body)
    defs = _top_level_defs(body)
    bound = module_bound_names(body, every)
    prefix_tree = _parse_or_none(prefix)
    prefix_bound = module_bound_names(prefix_tree.body, list(ast.walk(prefix_tree))) if prefix_tree else set()
    free = _global_reads(source) - bound - BUILTINS - {"__name__"}
    declared = set(interface) - {entry_point}
    entry_point = entry_point or _infer_entry_point(free - prefix_bound - declared, every)
    for name in [entry_point, *sorted(declared)]:
        refuse_unjudgeable(every, body, defs, name, bound)
    solution = {entry_point, *declared}
    unresolved = sorted(free - prefix_bound - solution - set(sys.stdlib_module_names))
    if unresolved:
        raise TestShapeError(
            _line_of(unresolved[0], every),
            f"the tests read `{unresolved[0]}`, which neither they nor the problem's code define: only the "
            f"entry point ({entry_point or 'none given'}) may come from the solution",
        )
    sites = Sites(body)
    reach = Reach(body, sites)
    planner = _Planner(source, body, defs, sites, reach, entry_point)
    planner.build()
    planner.refuse_dead_sites()
    for stmt in body:
        sites.instrument(stmt)
    if planner.split is not None:
        planner.wrap_split_check()
    steps = [
        Step(_compile_stmt(stmt) if isinstance(stmt, ast.stmt) else stmt, kind, unit, label, line)
        for stmt, kind, unit, label, line in planner.steps
    ]
    from_prefix = (free & prefix_bound) - solution
    prefix_code = compile(prefix, "<problem>", "exec", **_FLAGS) if from_prefix and prefix_tree else None
    imports = sorted((free - prefix_bound - solution) & set(sys.stdlib_module_names))
    plan = TestPlan(steps, planner.units, sites.lines, entry_point, prefix_code, imports, sorted(declared))
    if plan.total == 0:
        raise TestShapeError(
            1, "the tests contain no assert, no test function and no unittest case: nothing to pass"
        )
    return plan


class _Planner:
    """Rules 1-5: the steps and units of one test file, and the sites each unit must run."""

    def __init__(
        self,
        source: str,
        body: list[ast.stmt],
        defs: dict[str, ast.stmt],
        sites: Sites,
        reach: Reach,
        entry_point: str | None,
    ) -> None:
        self.source, self.body, self.defs, self.sites, self.reach = source, body, defs, sites, reach
        self.entry_point = entry_point
        self.asserting = _asserting_functions(defs, sites)
        self.steps: list[tuple] = []  # (stmt or code, kind, unit, label, line)
        self.units: list[Unit] = []
        self.covered: set[int] = set()  # sites some unit or set-up statement runs or reaches
        self.split: ast.FunctionDef | None = None
        self.split_units: list[tuple[int, int]] = []  # (index in check's body, unit)

    def is_test(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, SCOPES):
            return False
        return bool(self.sites.under([stmt], defs=False) or calls_outside_scopes(stmt) & self.asserting)

    def add_unit(self, label: str, line: int, lexical: set[int], reached: set[int], what: str) -> int:
        """A unit: its own sites and those it reaches (tripwires count for neither: they need not run)."""
        if not lexical and not reached:
            raise TestShapeError(
                line, f"{what} contains no assertion: a test that cannot fail proves nothing"
            )
        trips = self.sites.trips
        own = lexical - trips
        self.covered |= lexical | reached
        self.units.append(Unit(label, line, frozenset(own), frozenset(reached - lexical - trips)))
        return len(self.units) - 1

    def statement_unit(self, stmt: ast.stmt) -> int:
        lexical = self.sites.under([stmt])
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
        ):
            callee = self.defs.get(stmt.value.func.id)
            if isinstance(callee, FUNCS):  # `run_checks()`: its body is the unit's own code
                lexical |= self.sites.under(callee.body)
        reached = self.reach.reached([stmt])
        return self.add_unit(_label(self.source, stmt), stmt.lineno, lexical, reached, "the test")

    def setup(self, stmt: ast.stmt) -> None:
        self.covered |= self.sites.under([stmt], defs=False) | self.reach.reached([stmt], calls_only=True)

    def build(self) -> None:
        check = self.defs.get("check")
        called = {n for s in self.body for n in calls_outside_scopes(s)}
        explicit: list[ast.stmt] = []
        if isinstance(check, ast.FunctionDef) and "check" in self.asserting:
            if not self.entry_point:
                raise TestShapeError(
                    check.lineno, "the tests define check(candidate) but the problem names no entry_point"
                )
            explicit = [s for s in self.body if "check" in calls_outside_scopes(s)]
            plain = not explicit or (
                len(explicit) == 1 and _is_plain_call(explicit[0], "check", self.entry_point)
            )
            # Split only when nothing else calls or refers to check: its units then run exactly once.
            uses = sum(isinstance(n, ast.Name) and n.id == "check" for n in preorder(self.body))
            if plain and uses == len(explicit) and _flat_check(check):
                self.split = check
            elif not explicit:
                _require_one_argument(check)
        for stmt in self.body:
            if self.split is not None and explicit and stmt is explicit[0]:
                self._split_check_step(stmt)
            elif self.is_test(stmt):
                u = self.statement_unit(stmt)
                self.steps.append((stmt, "unit", u, self.units[u].label, stmt.lineno))
            else:
                self.setup(stmt)
                self.steps.append((stmt, "setup", -1, _label(self.source, stmt), stmt.lineno))
        if self.split is not None and not explicit:
            call = f"check({self.entry_point})"
            self._split_check_step(_added(call, self.split.lineno, call))
        elif isinstance(check, ast.FunctionDef) and "check" not in called and "check" in self.asserting:
            call = f"check({self.entry_point})"
            lexical, reached = self.sites.under(check.body), self.reach.reached([check])
            u = self.add_unit(call, check.lineno, lexical, reached, "check")
            self.steps.append((_added(call, check.lineno, call), "unit", u, call, check.lineno))
        for name, node in self.defs.items():
            if name.startswith("test") and isinstance(node, FUNCS) and name not in called:
                lexical, reached = self.sites.under(node.body), self.reach.reached([node])
                u = self.add_unit(f"{name}()", node.lineno, lexical, reached, f"test {name}")
                self.steps.append(
                    (_added(f"{RUN_TEST}({name})", node.lineno, name), "unit", u, f"{name}()", node.lineno)
                )
        for cls, methods in _test_cases(self.body, self.defs, self.reach).items():
            for method in methods:
                label = f"{cls}.{method.name}"
                lexical = self.sites.under(method.body)
                reached = self.reach.reached([method], classes=[cls])
                u = self.add_unit(label, method.lineno, lexical, reached, f"test {label}")
                call = f"{RUN_CASE}({cls}, {method.name!r})"
                self.steps.append((_added(call, method.lineno, label), "unit", u, label, method.lineno))

    def _split_check_step(self, stmt: ast.stmt | CodeType) -> None:
        assert self.split is not None
        for i, s in enumerate(self.split.body):
            if self.is_test(s):
                self.split_units.append((i, self.statement_unit(s)))
            else:
                self.setup(s)
        line = stmt.lineno if isinstance(stmt, ast.stmt) else self.split.lineno
        self.steps.append((stmt, "check", -1, f"check({self.entry_point})", line))

    def wrap_split_check(self) -> None:
        """Each unit statement of the split check in `with __mrl_unit__(u):` (after instrumenting)."""
        assert self.split is not None
        new = list(self.split.body)
        for i, u in self.split_units:
            s = new[i]
            scope = ast.Call(func=ast.Name(id=UNIT, ctx=ast.Load()), args=[ast.Constant(u)], keywords=[])
            new[i] = ast.copy_location(ast.With(items=[ast.withitem(context_expr=scope)], body=[s]), s)
        self.split.body = new
        ast.fix_missing_locations(self.split)

    def refuse_dead_sites(self) -> None:
        dead = sorted(set(range(len(self.sites))) - self.covered - self.sites.trips)
        if not dead:
            return
        line = self.sites.lines[dead[0]]
        owner = next((n for n, d in self.defs.items() if dead[0] in self.sites.under([d])), None)
        what = (
            f"`{owner}` asserts (line {line})" if owner else f"the assertion at line {line} is in code that"
        )
        raise TestShapeError(line, f"{what} but is never called by any test: its asserts would never run")


# ---- building steps -------------------------------------------------------------------------------


def _compile_stmt(stmt: ast.stmt) -> CodeType:
    try:
        return compile(ast.Module(body=[stmt], type_ignores=[]), "<tests>", "exec", **_FLAGS)
    except SyntaxError as e:  # `return` or `yield` outside a function
        raise TestShapeError(stmt.lineno, f"{e.msg}") from None


def _label(source: str, stmt: ast.stmt) -> str:
    text = ast.get_source_segment(source, stmt) or ast.dump(stmt)[:120]
    return (text.strip().splitlines()[0] if text.strip() else "")[:160]


def _added(code: str, line: int, label: str) -> CodeType:
    return compile(code, f"<tests:{label}>", "exec", **_FLAGS)


def _parse_or_none(source: str) -> ast.Module | None:
    if not source.strip():
        return None
    try:
        return ast.parse(source, "<problem>")
    except (SyntaxError, ValueError):  # APPS starter code stops at an open `def`: nothing it binds counts
        return None


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
    return isinstance(f, ast.Attribute) and f.attr == "main" and dotted(f.value) == "unittest"


def _top_level_defs(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    defs: dict[str, ast.stmt] = {}
    for stmt in body:
        if isinstance(stmt, (*FUNCS, ast.ClassDef)):
            if stmt.name in defs and (stmt.name.startswith(("test", "Test")) or stmt.name == "check"):
                raise TestShapeError(
                    stmt.lineno, f"`{stmt.name}` is defined twice: which one is meant is unclear"
                )
            defs[stmt.name] = stmt
    return defs


def _asserting_functions(defs: dict[str, ast.stmt], sites: Sites) -> set[str]:
    """Top-level functions with an assertion site, or that call such functions (a fixpoint)."""
    funcs = {name: node for name, node in defs.items() if isinstance(node, FUNCS)}
    calls = {
        name: {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for name, node in funcs.items()
    }
    found = {name for name, node in funcs.items() if sites.under([node])}
    while True:
        more = {name for name in funcs if name not in found and calls[name] & found}
        if not more:
            return found
        found |= more


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
    return not any(isinstance(n, banned) for s in check.body for n in [s, *walk_scope(s)])


def _require_one_argument(func: ast.FunctionDef) -> None:
    a = func.args
    required = len(a.posonlyargs) + len(a.args) - len(a.defaults)
    if (
        required > 1
        or any(d is None for d in a.kw_defaults)
        or (required == 0 and not a.vararg and not a.args)
    ):
        raise TestShapeError(func.lineno, "check() must take the entry point as its one required argument")


def _test_cases(body: list[ast.stmt], defs: dict[str, ast.stmt], reach: Reach) -> dict[str, list[ast.AST]]:
    """unittest cases the tests define, and the test methods of each (with inherited ones), by source line.

    The base may be named as imported (`unittest.TestCase`, `from unittest import TestCase`), under an
    alias (`import unittest as ut`, `from unittest import TestCase as TC`, `Base = unittest.TestCase`),
    or be a tests-defined case."""
    modules, bases = {"unittest"}, set(_CASE_BASES)
    for stmt in body:
        if isinstance(stmt, ast.Import):
            modules |= {a.asname for a in stmt.names if a.asname and a.name in ("unittest", "unittest.case")}
        elif isinstance(stmt, ast.ImportFrom) and stmt.module in ("unittest", "unittest.case"):
            bases |= {a.asname or a.name for a in stmt.names if a.name in _CASE_BASES}
        elif (
            isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        ):
            if _names_case_base(stmt.value, modules, bases):
                bases.add(stmt.targets[0].id)
    classes = {name: node for name, node in defs.items() if isinstance(node, ast.ClassDef)}

    def is_case(node: ast.ClassDef, seen: frozenset = frozenset()) -> bool:
        for base in node.bases:
            name = dotted(base)
            if _names_case_base(base, modules, bases) or (
                name in classes and name not in seen and is_case(classes[name], seen | {name})
            ):
                return True
        return False

    out: dict[str, list[ast.AST]] = {}
    for name, node in classes.items():
        if is_case(node):
            found = [m for m_name, m in reach.methods(node).items() if m_name.startswith("test")]
            if found:
                out[name] = sorted(found, key=lambda m: m.lineno)  # type: ignore[attr-defined]
        elif name.startswith("Test") and any(
            isinstance(s, FUNCS) and s.name.startswith("test") for s in node.body
        ):
            raise TestShapeError(node.lineno, f"class {name} has test methods but is not a unittest.TestCase")
    return out


def _names_case_base(node: ast.AST, modules: set[str], bases: set[str]) -> bool:
    parts = dotted(node).split(".")
    if len(parts) == 1:
        return parts[0] in bases
    return parts[0] in modules and parts[-1] in _CASE_BASES


# ---- names -----------------------------------------------------------------------------------------


def _global_reads(source: str) -> set[str]:
    """Every name some scope of the tests reads as a global (symtable knows Python's scoping rules)."""
    import symtable  # host only: the runner in the sandbox gets the plan, and never imports it

    out: set[str] = set()
    try:
        stack = [symtable.symtable(source, "<tests>", "exec")]
    except SyntaxError as e:  # what only the compiler sees: `return` outside a function, ...
        raise TestShapeError(e.lineno or 1, f"{e.msg}") from None
    while stack:
        table = stack.pop()
        out |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and s.is_global()}
        stack.extend(table.get_children())
    return out


def _infer_entry_point(candidates: set[str], every: list[ast.AST]) -> str | None:
    """Rule 6 without an entry_point: the one name the tests read that nothing else binds."""
    names = sorted(candidates - set(sys.stdlib_module_names))
    if len(names) > 1:
        raise TestShapeError(
            _line_of(names[1], every),
            f"the tests read {', '.join(f'`{n}`' for n in names)}, which neither they nor the problem's code "
            "define: only one name, the entry point, may come from the solution (set entry_point, and "
            "define the others in the tests)",
        )
    return names[0] if names else None


def _line_of(name: str, every: list[ast.AST]) -> int:
    return min((n.lineno for n in every if isinstance(n, ast.Name) and n.id == name), default=1)


# ---- the plan on the wire ----------------------------------------------------------------------------


def _code_to_text(code: CodeType) -> str:
    return base64.b64encode(marshal.dumps(code)).decode()


def plan_to_wire(plan: TestPlan) -> dict:
    """The plan as JSON-able data, code objects marshalled: the host plans once per problem, and the
    test runner in the sandbox (same interpreter binary) loads it instead of parsing the tests again."""
    return {
        "steps": [[_code_to_text(s.code), s.kind, s.unit, s.label, s.line] for s in plan.steps],
        "units": [[u.label, u.line, sorted(u.lexical), sorted(u.attributed)] for u in plan.units],
        "sites": plan.site_lines,
        "entry_point": plan.entry_point,
        "prefix": _code_to_text(plan.prefix) if plan.prefix is not None else None,
        "imports": plan.imports,
        "interface": plan.interface,
    }


def plan_from_wire(data: dict) -> TestPlan:
    """The inverse of `plan_to_wire`. Only for data from the host: unmarshalling trusts its input."""
    steps = [
        Step(marshal.loads(base64.b64decode(c)), str(kind), int(unit), str(label), int(line))
        for c, kind, unit, label, line in data["steps"]
    ]
    units = [
        Unit(str(label), int(line), frozenset(lex), frozenset(att)) for label, line, lex, att in data["units"]
    ]
    prefix = marshal.loads(base64.b64decode(data["prefix"])) if data["prefix"] is not None else None
    imports, interface = list(data["imports"]), list(data["interface"])
    return TestPlan(steps, units, list(data["sites"]), data["entry_point"], prefix, imports, interface)
