"""Coding problems with their unit tests: the record, the file formats, and the bundled set.

A problem is a prompt plus tests written as Python source (see `megatron_rl.reward.testplan` for
the shapes tests may take: top-level asserts, `test_*` functions, `check(candidate)`, unittest cases,
and the shapes refused because they cannot be judged), an optional `entry_point` (the function the
tests call), and an optional per-problem `timeout_s`.
Files are JSONL (one object per line), JSON (one object or a list) or Parquet (same columns; needs
pyarrow). Keys other than the known ones are kept in `metadata` (the bundled set keeps a reference
`solution` there, which its own tests check).

Problems are validated as they load, tests included (they must parse, contain something to pass, and
have a shape the runner can judge), so a malformed dataset fails at start-up with the file and line
of the record and the line of the tests, not as a stream of `sandbox_error` rewards in the middle of
a run, or worse, as rewards for wrong code. Problems judged by stdin/stdout pairs are refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUNDLED = Path(__file__).parent / "bundled" / "coding_problems.jsonl"
_KNOWN = ("id", "prompt", "tests", "entry_point", "timeout_s", "answer")
_IO_PAIR_KEYS = ("input_output", "inputs", "outputs", "stdin", "stdout")  # APPS / CodeContests shapes


@dataclass(frozen=True)
class Problem:
    """One prompt and how to score completions of it.

    `tests` is Python source run against the completion's code in the sandbox; `answer` serves
    in-process verifiers (a math answer) instead. `timeout_s` bounds the whole run (importing the
    code and every test) in wall-clock seconds; None takes the reward config's timeout.
    """

    id: str
    prompt: str
    tests: str = ""
    entry_point: str | None = None
    timeout_s: float | None = None
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

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
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not math.isfinite(self.timeout_s)
            or self.timeout_s <= 0
        ):
            raise ValueError(
                f"{where}: 'timeout_s' must be a positive, finite number of seconds; got {self.timeout_s!r}"
            )
        if self.answer is not None and not isinstance(self.answer, str):
            object.__setattr__(self, "answer", str(self.answer))

    def check_tests(self) -> None:
        """Raise ValueError unless the tests parse and contain at least one test."""
        if not self.tests.strip():
            return
        from megatron_rl.reward.testplan import plan_tests  # data does not need reward otherwise

        try:
            plan_tests(self.tests, self.entry_point)
        except SyntaxError as e:
            raise ValueError(
                f"problem {self.id!r}: its tests do not parse: {e.msg} (line {e.lineno})"
            ) from None
        except ValueError as e:
            raise ValueError(f"problem {self.id!r}: {e}") from None


def problem_from_dict(record: Any, default_id: str) -> Problem:
    """A Problem from one decoded record; unknown keys go to metadata."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object with at least 'prompt'; got {type(record).__name__}")
    if "prompt" not in record:
        raise ValueError(f"missing required key 'prompt' (keys present: {sorted(record)})")
    io_pairs = [k for k in _IO_PAIR_KEYS if k in record]
    if io_pairs and "tests" not in record:
        raise ValueError(
            f"judged by stdin/stdout pairs ({', '.join(io_pairs)}), which the sandbox's test runner does not "
            "support; give 'tests' as Python source that calls the solution (see megatron_rl.reward.testplan)"
        )
    if "tests" not in record and "answer" not in record:
        raise ValueError(
            f"needs 'tests' (Python source, for sandboxed rewards) or 'answer' (for verifiers); keys present: {sorted(record)}"
        )
    known = {k: record[k] for k in _KNOWN if k in record and record[k] is not None}
    known["id"] = str(known.get("id", default_id))
    metadata = {k: v for k, v in record.items() if k not in _KNOWN}
    problem = Problem(**known, metadata=metadata)
    problem.check_tests()
    return problem


def load_problems(source: str | Path) -> list[Problem]:
    """Problems from "bundled" or a .jsonl, .json or .parquet file."""
    path = BUNDLED if str(source) == "bundled" else Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"problem file {str(path)!r} does not exist; pass 'bundled' or a path to a .jsonl, .json or .parquet file"
        )
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records = _read_jsonl(path)
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None
        records = [
            (f"{path.stem}-{i}", r, f"{path}[{i}]")
            for i, r in enumerate(data if isinstance(data, list) else [data])
        ]
    elif suffix == ".parquet":
        records = _read_parquet(path)
    else:
        raise ValueError(f"{path}: unsupported problem file type {suffix!r}; use .jsonl, .json or .parquet")
    problems, seen = [], set()
    for default_id, record, where in records:
        try:
            problem = problem_from_dict(record, default_id)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None
        if problem.id in seen:
            raise ValueError(
                f"{where}: duplicate problem id {problem.id!r}; ids must be unique within a file"
            )
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise ValueError(f"{path}: contains no problems")
    return problems


def load_problem(path: str | Path, problem_id: str | None = None) -> Problem:
    """One problem: the only one in the file, or the one named `problem_id`."""
    problems = load_problems(path)
    if problem_id is not None:
        for p in problems:
            if p.id == problem_id:
                return p
        raise KeyError(
            f"no problem with id {problem_id!r} in {path}; ids start: {[p.id for p in problems[:10]]}"
        )
    if len(problems) != 1:
        raise ValueError(f"{path} holds {len(problems)} problems; choose one by id")
    return problems[0]


def _read_jsonl(path: Path) -> list[tuple[str, Any, str]]:
    records = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append((f"{path.stem}-{line_no}", json.loads(line), f"{path}:{line_no}"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON: {e}") from None
    return records


def _read_parquet(path: Path) -> list[tuple[str, Any, str]]:
    try:
        import pyarrow.parquet as pq  # optional dependency
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    rows = pq.read_table(path).to_pylist()
    return [(f"{path.stem}-{i}", row, f"{path} row {i}") for i, row in enumerate(rows)]
