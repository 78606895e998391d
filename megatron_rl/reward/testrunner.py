"""The trusted half of a test run: run a problem's test units against a solution in another process.

Standard library only; runs inside the sandbox in the test-runner process, which never executes the
solution's code. How tests become units, what passes, and which shapes are refused is `testplan`'s
docstring; this module applies it, with `proof.Recorder` gathering what each unit must prove. The
solution lives in another process and is reached through `RemoteObject`s: calling one sends the
arguments across (`wire.encode`), and what comes back is decoded into plain built-in values, so every
comparison an `assert` makes runs here, on values the solution cannot forge. Objects the codec cannot
carry (instances of the solution's classes, generators) come back as handles whose methods may be
called but which refuse `==`, ordering and hashing: asking an opaque object whether it equals the
expected answer is exactly the question a reward hacker wants to answer. Their truth is the one the
solution's process computed as it returned them, once (MBPP's `assert text_match(s)` on an `re.Match`):
any answer there is one the solution could have returned as a bool.

Two more things keep the remote model faithful to running the code in one process:
- An object's sequence protocol is answered once: the first `iter`, `len`, `in` or index (an int or a
  slice) materialises it (the solution iterates it, at most 100,000 items) and every later question is
  answered here from that one list, until the tests touch one of its attributes (a method such as
  `sort` may change it). An object cannot then say one thing to `iter` and another to `[i]` or `len`.
  Indexing it by anything else is refused.
- Arguments the solution mutates are mutated here too: after a call whose arguments hold lists, dicts,
  sets or bytearrays, the solution sends back their new contents and the test's own objects are
  updated in place, so a test that checks (or relies on) an argument after the call sees what the
  function did to it.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from megatron_rl.reward import proof, wire
from megatron_rl.reward.testplan import RUN_CASE, RUN_TEST, Step, TestPlan, TestShapeError, Unit, plan_tests

__all__ = [
    "Step",
    "TestPlan",
    "TestShapeError",
    "Unit",
    "plan_tests",
    "bind_solution",
    "run_units",
    "RemoteObject",
]


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
    """Something the solution owns: its entry point, or an object it returned that had no plain form."""

    __slots__ = ("_call", "_ref", "_type", "_items", "_truth")

    def __init__(
        self, call: Callable[[list], Any], ref: dict, type_name: str = "object", truth: bool | None = None
    ) -> None:
        object.__setattr__(self, "_call", call)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_items", None)
        object.__setattr__(self, "_truth", truth)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _ask(self._call, ["call", self._ref, list(args), kwargs])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        object.__setattr__(self, "_items", None)  # a method may change the object: ask again next time
        return _ask(self._call, ["get", self._ref, name])

    def _sequence(self) -> list:
        """The object's items, asked for once (module docstring): every later answer comes from here."""
        items = self._items
        if items is None:
            items = _ask(self._call, ["list", self._ref])
            if type(items) is not list:
                raise TypeError("the solution's iterator did not produce a list")
            object.__setattr__(self, "_items", items)
        return items

    def __iter__(self):
        return iter(self._sequence())

    def __len__(self) -> int:
        return len(self._sequence())

    def __contains__(self, item: Any) -> bool:
        return item in self._sequence()

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, slice)):
            return self._sequence()[key]
        raise TypeError(
            f"the solution returned a {self._type} object, which tests may index only by int or slice "
            "(as a sequence): return a dict for lookups by key"
        )

    def __repr__(self) -> str:
        return f"<solution {self._type}>"

    def _opaque(self, *_: Any) -> Any:
        raise TypeError(
            f"the solution returned a {self._type} object, which tests may not compare or test for "
            "truth: return plain values (numbers, strings, lists, tuples, dicts, sets)"
        )

    def __bool__(self) -> bool:
        """The truth the solution's process gave the object when it returned it (`re.match(...)` is
        true); a lie is no more than returning that bool. Without one (an entry point, a truth that
        raised), refused like a comparison."""
        if self._truth is None:
            return self._opaque()
        return self._truth

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _opaque

    def __setattr__(self, name: str, value: Any) -> None:
        """`root.left = Node(2)` (MBPP builds trees so): the solution's object takes the value, which
        crosses as any argument does."""
        if name.startswith("__"):
            raise TypeError("tests cannot set special attributes on the solution's objects")
        object.__setattr__(self, "_items", None)
        _ask(self._call, ["set", self._ref, name, value])


def _ask(call: Callable[[list], Any], op: list) -> Any:
    """One request to the solution, with the proof's tracer off while the runner's own code carries it.

    With a tracer set, CPython runs every frame of the thread on its slower tracing path; the channel
    and the codec need no tracing. The tests' frames keep their tracer: what the solution raises is
    seen there as it propagates, once the tracer is back (proof.py rule 2)."""
    tracer = sys.gettrace()
    if tracer is None:
        return call(op)
    sys.settrace(None)
    try:
        return call(op)
    finally:
        sys.settrace(tracer)


def bind_solution(plan: TestPlan, solution_names: list, values: dict, call: Callable[[list], Any]) -> dict:
    """The namespace tests run in: the runner's helpers, and the solution's entry point (with the
    interface names the problem declares).

    Nothing else of the solution is bound (testplan rule 6). A name that is top-level data (`ans = 42`)
    arrives in `values`, encoded, and is bound as the plain value it decodes to; a function, class or
    other object is bound as a RemoteObject. A name the solution does not define is left unbound, and
    `run_units` fails every unit before running any.
    """
    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__builtins__": builtins,
        "map": _Map,  # globals shadow the built-ins for the tests' code (cheaper than a builtins copy)
        "filter": _Filter,
        RUN_TEST: _run_test,
        RUN_CASE: _run_case,
        "exit": _exit,  # what `site` gives a script; never the solution's
        "quit": _exit,
    }
    offered = {n for n in solution_names if isinstance(n, str)}
    for name in plan.solution_names:
        if name not in offered:
            continue
        if name in values:
            try:
                namespace[name] = wire.decode(values[name])
            except wire.WireError:
                pass  # malformed: left unbound, so the tests fail
        else:
            namespace[name] = RemoteObject(call, {"n": name}, "function")
    return namespace


def _exit(code: Any = None) -> None:
    """`exit()` and `quit()` as a script has them: SystemExit (which fails the step that raises it)."""
    raise SystemExit(code)


# ---- arguments the solution mutated ---------------------------------------------------------------

_MUTABLE = (list, dict, set, bytearray)


def holds_mutable(values: Any, _depth: int = 0) -> bool:
    """Whether arguments (a list or tuple of them) hold a list, dict, set or bytearray a call could change."""
    if _depth > wire.MAX_DEPTH:
        return False
    return any(
        isinstance(v, _MUTABLE) or (isinstance(v, tuple) and holds_mutable(v, _depth + 1)) for v in values
    )


def write_back(original: Any, new: Any, _depth: int = 0) -> None:
    """Make the test's `original` argument hold what the solution left in its copy (`new`, decoded).

    In place, keeping the identity of nested lists, dicts and sets where their kind is unchanged, so a
    test holding a reference to an inner list sees its change too. Values of another shape than the
    original (a protocol lie) are ignored: a function cannot change the type of its caller's object."""
    if _depth > wire.MAX_DEPTH:
        return
    d = _depth + 1
    if isinstance(original, list) and type(new) is list:
        if len(original) != len(new):
            original[:] = new
            return
        for i, (o, n) in enumerate(zip(original, new)):
            if _same_kind(o, n):
                write_back(o, n, d)
            else:
                original[i] = n
    elif isinstance(original, dict) and type(new) is dict:
        for key in [k for k in original if k not in new]:
            del original[key]
        for key, n in new.items():
            o = original.get(key, _MISSING)
            if o is not _MISSING and _same_kind(o, n):
                write_back(o, n, d)
            else:
                original[key] = n
    elif isinstance(original, set) and type(new) is set:
        original.clear()
        original |= new
    elif isinstance(original, bytearray) and type(new) is bytearray:
        original[:] = new
    elif isinstance(original, tuple) and type(new) is tuple and len(original) == len(new):
        for o, n in zip(original, new):
            if _same_kind(o, n):
                write_back(o, n, d)


_MISSING = object()


def _same_kind(original: Any, new: Any) -> bool:
    return any(isinstance(original, t) and type(new) is t for t in (*_MUTABLE, tuple))


def apply_mutations(args: list, kwargs: dict, mutated: Any, make_handle: Callable[[Any], Any]) -> None:
    """Write the solution's report of its arguments after a call (`[args, kwargs]`, encoded) back."""
    if type(mutated) is not list or len(mutated) != 2:
        raise SolutionGone("malformed report of mutated arguments")
    try:
        new_args, new_kwargs = wire.decode(mutated[0], make_handle), wire.decode(mutated[1], make_handle)
    except wire.WireError as e:
        raise SolutionGone(f"the solution sent malformed arguments back: {e}") from None
    if type(new_args) is list and len(new_args) == len(args):
        for original, new in zip(args, new_args):
            write_back(original, new)
    if type(new_kwargs) is dict:
        for key, original in kwargs.items():
            if key in new_kwargs:
                write_back(original, new_kwargs[key])


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


class RunOutcome(NamedTuple):
    passed: int
    total: int
    failures: list[str]


def run_units(plan: TestPlan, namespace: dict) -> RunOutcome:
    """Run the steps in order, under the proof of `proof.py`; a set-up failure fails the problem."""
    labels = [u.label for u in plan.units]
    missing = [n for n in plan.solution_names if n not in namespace]
    if missing:
        return RunOutcome(0, plan.total, [f"the solution does not define `{missing[0]}`: no test ran"])
    try:
        _problem_code(plan, namespace)
    except BaseException as e:  # the problem's own code (or a stdlib import) failed: not the solution's fault
        return RunOutcome(
            0, plan.total, [f"set-up failed: the problem's code raised {type(e).__name__}: {e}"[:400]]
        )
    recorder = proof.Recorder(
        [u.lexical for u in plan.units], [u.attributed for u in plan.units], labels, plan.site_lines
    )
    namespace.update(recorder.hooks())
    with recorder.trace(proof.code_objects(s.code for s in plan.steps)):
        for step in plan.steps:
            outer = recorder.begin()
            error: BaseException | None = None
            try:
                exec(step.code, namespace)
            except BaseException as e:  # an assertion, a timeout, a dead solution, a test's own SystemExit
                error = e
            if step.kind == "unit":
                recorder.end_unit(step.unit, error, outer)
                continue
            if step.kind == "check" and error is not None and error is recorder.ended_by:
                error = None  # a unit of the split check ended it (time is up, ...): the rest did not run
            if not recorder.end_setup(step.line, step.label, error, outer):
                break
    passed, failures = recorder.outcome()
    return RunOutcome(passed, plan.total, failures)


def _problem_code(plan: TestPlan, namespace: dict) -> None:
    """The problem's code (testplan rule 6) and the stdlib modules the tests read, before any test."""
    if plan.prefix is not None:
        bound = {n: namespace[n] for n in plan.solution_names if n in namespace}
        exec(plan.prefix, namespace)
        namespace.update(bound)  # the prompt's stub of the entry point is not the solution
    for module in plan.imports:
        if module not in namespace:
            namespace[module] = importlib.import_module(module)


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
