"""What the grader needs of a problem: its tests (or stdin/stdout pairs, or an answer), entry point,
time limit, the problem's own code that runs first, and the interface the tests may call.

Where problems come from, and how records become these, is the data package's (data/problems.py,
data/public.py); what a test may look like is `testplan.py`'s. A Problem checks itself as it is built,
so a malformed dataset fails at start-up with the record named, not as rewards mid-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# Every pair goes to the sandbox in one frame (16 MiB, JSON-escaped): keep well under it.
MAX_IO_BYTES = 6 << 20


@dataclass(frozen=True)
class Problem:
    """One prompt and how to score completions of it.

    `tests` is Python source run against the completion's code in the sandbox; `io_tests` are
    (stdin, expected stdout) pairs for a completion that is a whole program (one or the other);
    `answer` serves in-process verifiers (a math answer) instead. `timeout_s` bounds the whole run
    (importing the code and every test) in wall-clock seconds; None takes the reward config's timeout.
    `prefix` is the problem's own code, run before the completion (module docstring). `interface`
    names what else the solution must define for the tests to call (MBPP's `Pair` next to its entry
    point: data/public.py); nothing else of the solution reaches the tests.
    """

    id: str
    prompt: str
    tests: str = ""
    entry_point: str | None = None
    timeout_s: float | None = None
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    io_tests: tuple[tuple[str, str], ...] = ()
    prefix: str = ""
    interface: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"problem {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"problem id must be a non-empty string; got {self.id!r}")
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        if not isinstance(self.tests, str):
            raise ValueError(
                f"{where}: 'tests' must be Python source as a string; got {type(self.tests).__name__}"
            )
        if self.entry_point is not None and not (
            isinstance(self.entry_point, str) and self.entry_point.isidentifier()
        ):
            raise ValueError(f"{where}: 'entry_point' must be a Python identifier; got {self.entry_point!r}")
        from megatron_rl.reward.sandbox import MAX_TIMEOUT_S  # the one bound, where jobs run

        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not math.isfinite(self.timeout_s)
            or self.timeout_s <= 0
            or self.timeout_s > MAX_TIMEOUT_S
        ):
            raise ValueError(
                f"{where}: 'timeout_s' must be a positive, finite number of seconds, at most {MAX_TIMEOUT_S} "
                f"(a day); got {self.timeout_s!r}"
            )
        names = tuple(self.interface) if isinstance(self.interface, (list, tuple)) else None
        if names is None or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(
                f"{where}: 'interface' must be a list of Python identifiers; got {self.interface!r}"
            )
        object.__setattr__(self, "interface", names)
        if not isinstance(self.prefix, str):
            raise ValueError(
                f"{where}: 'prefix' must be Python source as a string; got {type(self.prefix).__name__}"
            )
        if self.answer is not None and not isinstance(self.answer, str):
            object.__setattr__(self, "answer", str(self.answer))
        given = self.io_tests if isinstance(self.io_tests, (list, tuple)) else [self.io_tests]
        pairs = tuple(tuple(p) if isinstance(p, (list, tuple)) else p for p in given)
        if not all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs
        ):
            raise ValueError(f"{where}: 'io_tests' must be (stdin, expected stdout) pairs of strings")
        object.__setattr__(self, "io_tests", pairs)
        if pairs and self.tests.strip():
            raise ValueError(
                f"{where}: has both Python tests and stdin/stdout pairs; keep one kind (a completion is "
                "either a function the tests call or a program that reads stdin)"
            )
        size = sum(len(s.encode("utf-8", "surrogatepass")) for p in pairs for s in p)
        if size > MAX_IO_BYTES:
            raise ValueError(
                f"{where}: its stdin/stdout pairs hold {size / 2**20:.1f} MiB; the sandbox takes at most "
                f"{MAX_IO_BYTES >> 20} MiB a problem: keep fewer cases (e.g. not every generated one)"
            )

    def check_tests(self) -> str | None:
        """Raise ValueError unless the Python tests parse, contain a test and have a shape the runner can
        judge. Returns the entry point the tests use (given, or inferred from them), or None."""
        if not self.tests.strip():
            return self.entry_point  # no Python tests: stdin/stdout pairs (checked as built) or an answer
        from megatron_rl.reward.testplan import plan_tests

        try:
            return plan_tests(self.tests, self.entry_point, self.prefix, self.interface).entry_point
        except SyntaxError as e:
            raise ValueError(
                f"problem {self.id!r}: its tests do not parse: {e.msg} (line {e.lineno})"
            ) from None
        except ValueError as e:
            raise ValueError(f"problem {self.id!r}: {e}") from None
