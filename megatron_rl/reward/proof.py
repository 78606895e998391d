"""The proof a test unit needs to pass, gathered in the test runner while the tests run.

Standard library only; runs in the sandbox's trusted test runner (T in `harness.py`), which the
solution cannot reach: what is counted here is what the tests' own code did. The sites are those
`assertsites` numbered and rewrote; the rules are `testplan`'s verdict. A unit passes only when all of
these hold, so whatever the grader cannot prove fails closed:

1. its code ran to the end without raising;
2. no AssertionError passed through the tests' own code while it ran, raised there or in what it
   called, even if something caught it (`self.fail()` under `except Exception`, a context manager that
   swallows, an alias of AssertionError, `break` in `finally`): found by tracing, below;
3. every site that started during it held, each time (a swallowed failure is still a failure);
4. each of its lexical sites started during it (an assert under an `if`, or in a loop over an empty
   result, did not run: the unit fails);
5. at least one site started during it (a unit that asserted nothing proved nothing), unless all it
   has are tripwires (a test that expects an exception: `try: f(-1)` / `except ValueError: pass` /
   `else: self.fail()`), which rules 1-2 judge;
6. each site it reaches by name started at least once in the whole run (judged at the end).
Set-up steps obey 1-3; when they do not, the problem fails.

Tracing: `sys.settrace` with a global function that hands a local tracer only to frames running the
tests' own code objects (the steps' code and everything compiled inside them), with line events off,
so the runner's own code and the standard library run untraced; while a request to the solution is
carried the tracer is cleared altogether (`testrunner._ask`: CPython would otherwise run the channel and
the codec on its slower tracing path) and put back before what it raised propagates. The local tracer
sees "exception" events: one for each frame of the tests an exception passes through, caught there or
not. The solution runs in another process and is never traced.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import CodeType
from typing import Any

from megatron_rl.reward.assertsites import CLEAR, DONE, HELD, START

UNIT = "__mrl_unit__"


def code_objects(codes: Iterable[CodeType]) -> set[CodeType]:
    """Every code object compiled inside `codes` (functions, classes, lambdas, comprehensions), them too."""
    found: set[CodeType] = set()
    stack = list(codes)
    while stack:
        code = stack.pop()
        if code in found:
            continue
        found.add(code)
        stack.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return found


class _Context:
    """What happened in one unit or set-up step so far."""

    __slots__ = ("started", "held", "assertion_seen")

    def __init__(self) -> None:
        self.started: dict[int, int] = {}
        self.held: dict[int, int] = {}
        self.assertion_seen = False


class Recorder:
    """Counts site starts and holds per unit, watches the tests' frames, and renders the verdicts.

    `lexical[u]`, `attributed[u]`: the site sets of unit u (see `assertsites`); `labels[u]` and
    `site_lines[k]` name them in failure messages."""

    def __init__(
        self,
        lexical: list[frozenset[int]],
        attributed: list[frozenset[int]],
        labels: list[str],
        site_lines: list[int],
    ) -> None:
        self.lexical, self.attributed, self.labels, self.site_lines = lexical, attributed, labels, site_lines
        self.ever = [0] * len(site_lines)  # starts per site over the whole run
        self.verdicts: list[str | None] = [None] * len(labels)  # None: passed so far; else why not
        self.ran = [False] * len(labels)
        self.context = _Context()
        self.setup_error: str | None = None
        self.ended_by: BaseException | None = None  # what a unit of a split `check` let through

    # ---- the hooks the instrumented tests call -----------------------------------------------

    def hooks(self) -> dict[str, Any]:
        return {START: self.start, HELD: self.held, DONE: self.done, CLEAR: self.clear, UNIT: self.unit}

    def start(self, k: int) -> bool:
        c = self.context
        c.started[k] = c.started.get(k, 0) + 1
        self.ever[k] += 1
        return True

    def held(self, k: int, value: Any) -> bool:
        truth = bool(value)  # a solution's opaque object refuses: TypeError, the unit fails
        if truth:
            self.context.held[k] = self.context.held.get(k, 0) + 1
        return truth

    def clear(self, k: int, value: Any) -> bool:
        truth = bool(value)
        if not truth:
            self.context.held[k] = self.context.held.get(k, 0) + 1
        return truth

    def done(self, k: int, value: Any) -> Any:
        self.context.held[k] = self.context.held.get(k, 0) + 1
        return value

    def unit(self, u: int) -> _UnitScope:
        """`with __mrl_unit__(u):` around one statement of a split `check` (testplan rule 5)."""
        return _UnitScope(self, u)

    def assertion_passed_through(self) -> None:
        self.context.assertion_seen = True

    # ---- units and set-up ----------------------------------------------------------------------

    def begin(self) -> _Context:
        """A fresh context for a unit or a set-up step; returns the one it replaces."""
        outer, self.context = self.context, _Context()
        return outer

    def end_unit(self, u: int, error: BaseException | None, outer: _Context) -> bool:
        """Record unit u's verdict from what its context saw; restore `outer`. True when it passed."""
        c, self.context = self.context, outer
        self.ran[u] = True
        why = self._why_not(c, self.lexical[u], error, attributed=self.attributed[u])
        self.verdicts[u] = why
        return why is None

    def end_setup(self, line: int, label: str, error: BaseException | None, outer: _Context) -> bool:
        """Judge a set-up step by rules 1-3; False (and the problem fails) when it broke one."""
        c, self.context = self.context, outer
        why = self._why_not(c, frozenset(), error, setup=True)
        if why is not None and self.setup_error is None:
            self.setup_error = f"set-up (line {line}) failed: {label} -> {why}"
        return why is None

    def _why_not(
        self,
        c: _Context,
        lexical: frozenset[int],
        error: BaseException | None,
        setup: bool = False,
        attributed: frozenset[int] = frozenset(),
    ) -> str | None:
        if error is not None:
            detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            return detail[:300]
        if c.assertion_seen:
            return "an AssertionError passed through the tests' code and was caught: a failed assertion"
        for k, n in c.started.items():
            if c.held.get(k, 0) != n:
                return f"the assertion at line {self.site_lines[k]} failed and the failure was caught"
        if setup:
            return None
        missing = sorted(k for k in lexical if k not in c.started)
        if missing:
            return (
                f"the assertion at line {self.site_lines[missing[0]]} never ran: every assertion of a test "
                "must run (under an `if` that was false, or in a loop over nothing?)"
            )
        if not c.started and (lexical or attributed):
            return "no assertion ran: a test that asserts nothing proves nothing"
        return None

    # ---- tracing -----------------------------------------------------------------------------

    def trace(self, codes: set[CodeType]) -> _Tracing:
        """A context manager: while it is open, exceptions passing through `codes` frames are seen."""
        return _Tracing(self, codes)

    # ---- the outcome -------------------------------------------------------------------------

    def outcome(self) -> tuple[int, list[str]]:
        """(units passed, failure lines), rule 6 applied; a set-up failure passes nothing."""
        failures = []
        passed = 0
        for u, label in enumerate(self.labels):
            why = self.verdicts[u] if self.ran[u] else "did not run"
            if why is None:
                dead = sorted(k for k in self.attributed[u] if not self.ever[k])
                if dead:
                    why = (
                        f"reaches the assertion at line {self.site_lines[dead[0]]}, which never ran in the "
                        "whole run (a helper referenced but never called?)"
                    )
            if why is None:
                passed += 1
            else:
                failures.append(f"test {u + 1} failed: {label} -> {why}")
        if self.setup_error is not None:
            failures.append(self.setup_error)
            failures.append("set-up failed, so the problem fails: no test counts as passed")
            return 0, failures
        return passed, failures


class _UnitScope:
    """One unit inside a split `check`: a failure is recorded and does not stop the next statement."""

    def __init__(self, recorder: Recorder, u: int) -> None:
        self.recorder, self.u, self.outer = recorder, u, None

    def __enter__(self) -> None:
        self.outer = self.recorder.begin()

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        self.recorder.end_unit(self.u, error, self.outer)  # type: ignore[arg-type]
        if error is None or isinstance(error, Exception):
            return True  # this unit's failure, recorded; the next statement runs
        # A BaseException (time is up, the solution is gone, a test's SystemExit) ends the whole check,
        # as it would end the test file; the units after it did not run. It is not a set-up failure.
        self.recorder.ended_by = error
        return False


class _Tracing:
    def __init__(self, recorder: Recorder, codes: set[CodeType]) -> None:
        self.recorder, self.codes, self.previous = recorder, codes, None

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code in self.codes:
            frame.f_trace_lines = False
            return self._local
        return None

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "exception" and issubclass(arg[0], AssertionError):
            self.recorder.assertion_passed_through()
        return self._local

    def __enter__(self) -> None:
        self.previous = sys.gettrace()
        sys.settrace(self._global)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)
