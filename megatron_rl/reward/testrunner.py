"""The trusted half of a test run: split a problem's tests into units and run them against a remote solution.

Standard library only; runs inside the sandbox in the test-runner process, which never executes the
solution's code. The solution lives in another process and is reached through `RemoteObject`s:
calling one sends the arguments across (`wire.encode`), and what comes back is decoded into plain
built-in values, so every comparison an `assert` makes runs here, on values the solution cannot
forge. Objects the codec cannot carry (instances of the solution's classes, generators) come back as
handles whose methods may be called but which refuse `==`, `bool()` and hashing: asking an opaque
object whether it equals the expected answer is exactly the question a reward hacker wants to answer.

How tests become units (each unit passes or fails on its own, which gives partial credit):
- `def test_*()` functions: each is a unit; every other statement is setup, run first, in order.
- `def check(candidate)` (the HumanEval shape), with the problem's `entry_point`: the statements of
  its body run one by one with `candidate` bound to the solution's entry point; those containing an
  `assert` are units.
- otherwise (the MBPP shape): every top-level statement containing an `assert` is a unit and the
  others are setup.
Limits of the remote model: tests compare return values; a test that expects the solution to mutate
an argument in place, or that passes a lambda to it, cannot be expressed.
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

from megatron_rl.reward import wire


class JobTimeout(BaseException):
    """The job's deadline passed. A BaseException so a test's `except Exception` cannot swallow it."""


class SolutionGone(BaseException):
    """The solution process exited, was killed, or broke the protocol; nothing more can be asked of it."""


class SolutionError(Exception):
    """The solution raised an exception that is not one of the interpreter's built-in ones."""


@dataclass
class Unit:
    code: CodeType
    is_test: bool
    label: str  # the source line, for failure messages


@dataclass
class TestPlan:
    units: list[Unit]
    names: set[str]  # every name the tests read: only these are bound to the solution
    candidate: str | None  # the name `check`'s parameter binds to the entry point, if any

    @property
    def total(self) -> int:
        return sum(u.is_test for u in self.units)


def _label(source: str, node: ast.AST) -> str:
    text = ast.get_source_segment(source, node) or ast.dump(node)[:120]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:160]


def _compile(stmt: ast.stmt) -> CodeType:
    return compile(ast.Module(body=[stmt], type_ignores=[]), "<tests>", "exec")


def _has_assert(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt))


def plan_tests(source: str, entry_point: str | None) -> TestPlan:
    """Split test source into setup and test units. Raises SyntaxError or ValueError on unusable tests."""
    tree = ast.parse(source, "<tests>")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    tests_fns = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test") and not n.args.args
    ]
    units: list[Unit] = []
    candidate = None
    if tests_fns:
        units = [Unit(_compile(s), False, _label(source, s)) for s in tree.body]
        for fn in tests_fns:
            call = compile(f"{fn.name}()", f"<tests:{fn.name}>", "exec")
            units.append(Unit(call, True, f"{fn.name}()"))
    elif (check := _find_check(tree)) is not None:
        if not entry_point:
            raise ValueError("the tests define check(candidate) but the problem names no entry_point")
        candidate = check.args.args[0].arg
        names.add(candidate)
        units = [Unit(_compile(s), False, _label(source, s)) for s in tree.body if not _calls_check(s)]
        try:
            units += [Unit(_compile(s), _has_assert(s), _label(source, s)) for s in check.body]
        except SyntaxError:  # `return` in the body: run check() whole, as one unit
            units.append(Unit(compile(f"check({candidate})", "<tests:check>", "exec"), True, "check()"))
    else:
        units = [Unit(_compile(s), _has_assert(s), _label(source, s)) for s in tree.body]
    plan = TestPlan(units, names, candidate)
    if plan.total == 0:
        raise ValueError("the tests contain no assert statement and no test_*() function: nothing to pass")
    return plan


def _find_check(tree: ast.Module) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check" and len(node.args.args) == 1:
            return node
    return None


def _calls_check(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Name)
        and stmt.value.func.id == "check"
    )


# Exceptions the solution may raise that tests may expect by type (`except ValueError`). Anything else
# arrives as SolutionError; BaseException-only types (SystemExit...) never cross as themselves.
_BUILTIN_ERRORS = {
    name: obj
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning)
}


def raise_remote(type_name: Any, message: Any) -> None:
    name = type_name if isinstance(type_name, str) else "Exception"
    text = message[:500] if isinstance(message, str) else ""
    cls = _BUILTIN_ERRORS.get(name)
    if cls is None:
        raise SolutionError(f"{name[:80]}: {text}")
    try:
        exc = cls(text)
    except Exception:  # an exception type whose constructor wants other arguments (UnicodeError kin)
        exc = SolutionError(f"{name}: {text}")
    raise exc


class RemoteObject:
    """Something the solution owns: a top-level name, or an object it returned that had no plain form."""

    __slots__ = ("_call", "_ref", "_type")

    def __init__(self, call: Callable[[list], Any], ref: dict, type_name: str = "object") -> None:
        object.__setattr__(self, "_call", call)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(["call", self._ref, list(args), kwargs])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._call(["get", self._ref, name])

    def __getitem__(self, key: Any) -> Any:
        return self._call(["getitem", self._ref, key])

    def __len__(self) -> int:
        n = self._call(["len", self._ref])
        if type(n) is not int or n < 0:
            raise TypeError("the solution's __len__ did not return a non-negative int")
        return n

    def __iter__(self):  # materialised by the solution, compared here
        items = self._call(["list", self._ref])
        if type(items) is not list:
            raise TypeError("the solution's iterator did not produce a list")
        return iter(items)

    def __repr__(self) -> str:
        return f"<solution {self._type}>"

    def _opaque(self, *_: Any) -> Any:
        raise TypeError(
            f"the solution returned a {self._type} object, which tests may not compare or test for "
            "truth: return plain values (numbers, strings, lists, tuples, dicts, sets)"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __contains__ = _opaque

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("tests cannot set attributes on the solution's objects")


def bind_solution(
    plan: TestPlan, solution_names: list, values: dict, entry_point: str | None, call: Callable[[list], Any]
) -> dict:
    """The namespace tests run in: the solution's names the tests read.

    Top-level data the solution defined (`ans = 42`) arrives in `values`, encoded, and is bound as the
    plain value it decodes to; functions, classes and other objects are bound as RemoteObjects. Names of
    built-ins and standard-library modules are never bound, even if the solution defines them:
    otherwise a solution defining `len` or `math` would answer the tests' own questions.
    """
    namespace: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins}
    reserved = set(dir(builtins)) | set(sys.stdlib_module_names)
    offered = {n for n in solution_names if isinstance(n, str) and n.isidentifier()}
    for name in plan.names & offered:
        if name in reserved and name != entry_point:
            continue
        if name in values:
            try:
                namespace[name] = wire.decode(values[name])
                continue
            except wire.WireError:
                pass  # malformed: leave the name unbound, so tests reading it fail
        else:
            namespace[name] = RemoteObject(call, {"n": name}, "function")
    if plan.candidate and entry_point:
        namespace[plan.candidate] = RemoteObject(call, {"n": entry_point}, "function")
    return namespace


@dataclass
class RunOutcome:
    passed: int
    total: int
    failures: list[str]


def run_units(plan: TestPlan, namespace: dict) -> RunOutcome:
    """Run every unit in order; a unit passes when it raises nothing."""
    passed, failures = 0, []
    index = 0
    for unit in plan.units:
        if unit.is_test:
            index += 1
        try:
            exec(unit.code, namespace)
        except BaseException as e:  # an assertion, a timeout, a dead solution, a test's own SystemExit
            failures.append(_failure(unit, index, e))
        else:
            passed += unit.is_test
    return RunOutcome(passed, plan.total, failures)


def _failure(unit: Unit, index: int, exc: BaseException) -> str:
    what = f"test {index}" if unit.is_test else "setup"
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{what} failed: {unit.label} -> {detail[:300]}"


def decode_reply(reply: Any, make_handle: Callable[[Any], Any]) -> Any:
    """The value in a solution's reply to one request, raising what the solution raised."""
    if type(reply) is not dict:
        raise SolutionGone("malformed reply from the solution")
    if "ok" in reply:
        try:
            return wire.decode(reply["ok"], make_handle)
        except wire.WireError as e:
            raise SolutionGone(f"the solution sent a malformed value: {e}") from None
    if "raise" in reply and type(reply["raise"]) is list and len(reply["raise"]) == 2:
        raise_remote(*reply["raise"])
    raise SolutionGone("malformed reply from the solution")
