"""The trusted half of a test run: run a problem's test units against a solution in another process.

Standard library only; runs inside the sandbox in the test-runner process, which never executes the
solution's code. How tests become units, what passes, and which shapes are refused is `testplan`'s
docstring; this module applies it. The solution lives in another process and is reached through
`RemoteObject`s: calling one sends the arguments across (`wire.encode`), and what comes back is decoded
into plain built-in values, so every comparison an `assert` makes runs here, on values the solution
cannot forge. Objects the codec cannot carry (instances of the solution's classes, generators) come
back as handles whose methods may be called but which refuse `==`, `bool()` and hashing: asking an
opaque object whether it equals the expected answer is exactly the question a reward hacker wants to
answer.

Limits of the remote model: tests compare return values; a test that expects the solution to mutate
an argument in place, or that passes a lambda to it, cannot be expressed.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from megatron_rl.reward import testplan, wire
from megatron_rl.reward.testplan import TestPlan, TestShapeError, Unit, plan_tests

__all__ = ["TestPlan", "TestShapeError", "Unit", "plan_tests", "bind_solution", "run_units", "RemoteObject"]


class JobTimeout(BaseException):
    """The job's deadline passed. A BaseException so a test's `except Exception` cannot swallow it."""


class SolutionGone(BaseException):
    """The solution process exited, was killed, or broke the protocol; nothing more can be asked of it."""


class SolutionError(Exception):
    """The solution raised an exception the tests may not see as itself (its own class, StopIteration...)."""


# Exceptions the solution may raise that tests may expect by type (`except ValueError`). Anything else
# arrives as SolutionError; BaseException-only types (SystemExit...) never cross as themselves.
# StopIteration and StopAsyncIteration are left out: raised inside `map`/`all`, they would end an
# iteration silently instead of failing the test (see testplan, "Iteration-protocol exceptions").
_BUILTIN_ERRORS = {
    name: obj
    for name, obj in vars(builtins).items()
    if isinstance(obj, type)
    and issubclass(obj, Exception)
    and not issubclass(obj, (Warning, StopIteration, StopAsyncIteration))
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
    """The namespace tests run in: the runner's helpers, and the solution's names the tests read.

    Only names the tests read and never bind (`plan.names`) are looked up in the solution. Top-level
    data the solution defined (`ans = 42`) arrives in `values`, encoded, and is bound as the plain value
    it decodes to; functions, classes and other objects are bound as RemoteObjects. Names of built-ins
    and standard-library modules are never bound, even if the solution defines them: otherwise a
    solution defining `len` or `math` would answer the tests' own questions.
    """
    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "map": _Map,  # globals shadow the built-ins for the tests' code (cheaper than a builtins copy)
        "filter": _Filter,
        testplan.RUN_TEST: _run_test,
        testplan.RUN_CASE: _run_case,
    }
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


def _no_stop(func: Any) -> Any:
    def call(*args: Any) -> Any:
        try:
            return func(*args)
        except StopIteration as e:
            raise RuntimeError("StopIteration escaped the function given to map() or filter()") from e

    return call


class _Map(map):
    """`map` whose function may not end the iteration by raising StopIteration (PEP 479's rule)."""

    def __new__(cls, func: Any, *iterables: Any) -> Any:
        return map.__new__(cls, _no_stop(func), *iterables)


class _Filter(filter):
    """`filter` whose function may not end the iteration by raising StopIteration (PEP 479's rule)."""

    def __new__(cls, func: Any, iterable: Any) -> Any:
        return filter.__new__(cls, None if func is None else _no_stop(func), iterable)


def _run_test(func: Any) -> None:
    """Run one `test*` function; it passes only if it returns None (async ones under asyncio.run)."""
    result = func()
    if isinstance(result, types.CoroutineType):
        import asyncio  # only tests with async functions pay for it

        result = asyncio.run(result)
    if result is not None:
        raise AssertionError(
            f"{getattr(func, '__name__', 'the test')} returned {type(result).__name__} instead of None: "
            "a test must assert, not return its verdict"
        )


def _run_case(cls: type, method: str) -> None:
    """Run one unittest method through unittest; it passes only if it ran and nothing went wrong."""
    import unittest  # only tests with TestCase classes pay for it

    if method not in unittest.TestLoader().getTestCaseNames(cls):
        raise AssertionError(f"unittest does not see {cls.__name__}.{method} as a test")
    result = unittest.TestResult()
    unittest.TestSuite([cls(method)]).run(result)
    bad = [
        *(f"failure: {t}" for _, t in result.failures),
        *(f"error: {t}" for _, t in result.errors),
        *(f"skipped: {why}" for _, why in result.skipped),
        *("expected failure" for _ in result.expectedFailures),
        *("unexpected success" for _ in result.unexpectedSuccesses),
    ]
    if bad or result.testsRun != 1:
        detail = bad[0].strip().splitlines()[-1] if bad else f"unittest ran {result.testsRun} tests"
        raise AssertionError(f"{cls.__name__}.{method}: {detail}")


@dataclass
class RunOutcome:
    passed: int
    total: int
    failures: list[str]


def run_units(plan: TestPlan, namespace: dict) -> RunOutcome:
    """Run the steps in order. A unit passes when it raises nothing; a set-up failure fails the problem."""
    passed, failures = 0, []
    index = 0
    for unit in plan.units:
        if unit.is_test:
            index += 1
        try:
            exec(unit.code, namespace)
        except BaseException as e:  # an assertion, a timeout, a dead solution, a test's own SystemExit
            failures.append(_failure(unit, index, e))
            if not unit.is_test:
                failures.append("set-up failed, so the problem fails: no test counts as passed")
                return RunOutcome(0, plan.total, failures)
        else:
            passed += unit.is_test
    return RunOutcome(passed, plan.total, failures)


def _failure(unit: Unit, index: int, exc: BaseException) -> str:
    what = f"test {index}" if unit.is_test else f"set-up (line {unit.line})"
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
