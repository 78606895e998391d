"""Coding problems with their tests: the record, and how records become validated problems.

A problem is a prompt plus one kind of tests:
- Python tests, as source (see `megatron_rl.reward.testplan` for the shapes they may take: top-level
  asserts, `test_*` functions, `check(candidate)`, unittest cases, and the shapes refused because they
  cannot be judged), with an optional `entry_point` (the function the tests call); or as a list of
  test statements, strings (MBPP's `test_list`: `tests: ["assert f(1) == 2", ...]`), one a line, each
  top-level statement a unit as always; or
- stdin/stdout pairs (`io_tests`): the completion is a program, run once per pair with the input on
  stdin, passing a pair when it exits 0 and prints the expected output (see `reward/stdio.py` for the
  comparison: trailing whitespace of each line and trailing blank lines are ignored, nothing else).
  A record gives them as `tests: [{"input": ..., "output": ...}, ...]` (a list of objects, where a list
  of strings is Python test statements), as `tests: {"inputs": [...],
  "outputs": [...]}` (or `input`/`output`: CodeContests' `public_tests`), or as `input_output` in
  APPS's shape (that object, or the JSON string of it). An input or output given as a list of lines
  is joined with newlines. APPS's call-based cases (`fn_name`) become Python tests that call the
  function (`public.call_based_tests`).
Either kind may carry a per-problem `timeout_s` (the whole run, every test), and `prefix`: the
problem's own code that runs before the completion (HumanEval's prompt, APPS's starter code; see
`extract.compose_program`), from which the tests may also read names. `answer` serves in-process
verifiers instead. Keys other than the known ones are kept in `metadata` (the bundled set keeps a
reference `solution` there, which its own tests check). Without an `entry_point`, the one name the
tests read and do not define is the entry point (`testplan` rule 6).

Public sets load as they ship, with no mapping: HumanEval, MBPP and APPS/TACO rows are recognised by
their columns (`public.py`, which says how each is graded). Where the records come from (JSONL, gzipped
JSONL, JSON, Parquet, a saved `datasets` folder, a folder or glob of files) is `sources.py`.
`data.columns` maps our field names to the dataset's column names (`{prompt: question, input_output:
io}`); a column named like a mapped field is then ignored. A record without a prompt or without tests
is refused with the `data.columns.FIELD=<your column>` that would map one.

Problems are validated as they load, tests included (Python tests must parse, contain something to
pass, and have a shape the runner can judge; pairs must be strings), so a malformed dataset fails at
start-up with the file and line or row of the record, not as a stream of `sandbox_error` rewards in
the middle of a run, or worse, as rewards for wrong code.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megatron_rl.data import public
from megatron_rl.data.sources import BUNDLED, read_records
from megatron_rl.reward.problem import Problem

__all__ = ["BUNDLED", "FIELDS", "load_problem", "load_problems", "problem_from_dict"]

# The fields a record may set; `data.columns` maps these names to a dataset's own.
FIELDS = (
    "id",
    "prompt",
    "tests",
    "input_output",
    "entry_point",
    "timeout_s",
    "answer",
    "prefix",
    "interface",
)
_LOOSE_IO_KEYS = ("inputs", "outputs", "stdin", "stdout")  # pair halves in columns of their own


def problem_from_dict(record: Any, default_id: str) -> Problem:
    """A Problem from one decoded record; unknown keys go to metadata."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object with at least 'prompt'; got {type(record).__name__}")
    record = public.to_fields(record)
    if "prompt" not in record:
        raise ValueError(
            f"missing required key 'prompt' (keys present: {sorted(record)}); map the column that holds "
            f"the prompt with data.columns.prompt=<your column>{_column_example(record, _PROMPT_LIKE)}"
        )
    known = {k: record[k] for k in FIELDS if k in record and record[k] is not None}
    io = known.pop("input_output", None)
    tests = known.get("tests")
    if io is not None and tests is not None:
        raise ValueError("has both 'tests' and 'input_output'; keep one (map the other away in data.columns)")
    if isinstance(tests, list) and any(isinstance(t, str) for t in tests) and not _is_statements(tests):
        raise ValueError(
            "has a list of tests mixing strings and other values: give test statements (a list of strings, "
            "e.g. MBPP's test_list) or stdin/stdout pairs (a list of {input, output} objects), not both"
        )
    if _is_statements(tests):  # MBPP's test_list: one assert a string, each a unit of the Python tests
        known["tests"] = "".join(line.rstrip("\n") + "\n" for line in tests)
    elif tests is not None and (not isinstance(tests, str) or _is_io_json(tests)):
        io = known.pop("tests")
    if io is not None and _call_based(io) is not None:  # APPS's fn_name cases: Python tests of a function
        spec = _call_based(io)
        entry, call = public.call_target(spec["fn_name"], known.get("prefix") or "")
        known["tests"] = public.call_based_tests(spec, call)
        known.setdefault("entry_point", entry)
    elif io is not None:
        known["io_tests"] = _io_pairs(io)
    elif "tests" not in known and "answer" not in known:
        loose = [k for k in _LOOSE_IO_KEYS if k in record]
        hint = (
            f" ({', '.join(loose)} look like stdin/stdout halves: give them as tests=[{{input, output}}, "
            "...] or input_output={inputs: [...], outputs: [...]})"
            if loose
            else ""
        )
        raise ValueError(
            "needs 'tests' (Python source, a list of test statements, or stdin/stdout pairs) or "
            "'input_output' (APPS pairs) for sandboxed rewards, or 'answer' (for verifiers); keys present: "
            f"{sorted(record)}{hint}; map the column that holds them with data.columns.tests=<your column>"
            f"{_column_example(record, _TESTS_LIKE)}"
        )
    known["id"] = str(known.get("id", default_id))
    metadata = {k: v for k, v in record.items() if k not in FIELDS}
    problem = Problem(**known, metadata=metadata)
    entry = problem.check_tests()
    if entry != problem.entry_point:  # inferred from the tests (MBPP names none)
        problem = dataclasses.replace(problem, entry_point=entry)
    return problem


# Column names that usually hold a prompt or the tests, for the example in a missing-field error.
_PROMPT_LIKE = ("question", "text", "problem", "description", "instruction", "problem_statement", "content")
_TESTS_LIKE = ("test_list", "test", "test_code", "unit_tests", "test_cases", "asserts")


def _column_example(record: dict, likely: tuple[str, ...]) -> str:
    """', e.g. data.columns.FIELD=question' naming a column the record has that usually holds it."""
    field = "prompt" if likely is _PROMPT_LIKE else "tests"
    column = next((c for c in likely if c in record), None)
    return f", e.g. data.columns.{field}={column}" if column else ""


def _is_statements(tests: Any) -> bool:
    """A list of Python test statements as strings (MBPP's `test_list`: `["assert f(1) == 2", ...]`), not
    stdin/stdout pairs (a list of objects). A list mixing the two is neither, and is refused as pairs."""
    return isinstance(tests, list) and bool(tests) and all(isinstance(t, str) for t in tests)


def _call_based(value: Any) -> dict | None:
    """APPS's `input_output` when it is call-based (has `fn_name`), decoded; else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) and value.get("fn_name") else None


def _is_io_json(text: str) -> bool:
    """APPS's `input_output` JSON string given as `tests` (Python tests never start with a brace)."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and ("inputs" in value or "input" in value)


def _io_pairs(value: Any) -> tuple[tuple[str, str], ...]:
    """(stdin, expected stdout) pairs from the shapes datasets store them in (see the module docstring)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"stdin/stdout tests given as a string must be JSON: {e}") from None
    if isinstance(value, dict):
        ins = value.get("inputs", value.get("input"))
        outs = value.get("outputs", value.get("output"))
        if not isinstance(ins, list) or not isinstance(outs, list):
            raise ValueError(
                "stdin/stdout tests as an object need the lists 'inputs' and 'outputs' (or 'input' and "
                f"'output'); keys present: {sorted(value)}"
            )
        if len(ins) != len(outs):
            raise ValueError(f"stdin/stdout tests have {len(ins)} inputs but {len(outs)} outputs")
        raw = list(zip(ins, outs))
    elif isinstance(value, list):
        raw = []
        for i, item in enumerate(value):
            if not isinstance(item, dict) or "input" not in item or "output" not in item:
                got = sorted(item) if isinstance(item, dict) else type(item).__name__
                raise ValueError(
                    f"stdin/stdout test {i} must be an object with 'input' and 'output'; got {got}"
                )
            raw.append((item["input"], item["output"]))
    else:
        raise ValueError(
            f"tests must be Python source, or stdin/stdout pairs (a list of {{input, output}} objects or "
            f"{{inputs: [...], outputs: [...]}}); got {type(value).__name__}"
        )
    if not raw:
        raise ValueError("has an empty list of stdin/stdout tests: nothing to pass")
    pairs = tuple((_io_text(i, n, "input"), _io_text(o, n, "output")) for n, (i, o) in enumerate(raw))
    if all(not o.strip() for _, o in pairs):
        # A program that prints nothing would pass every pair: such tests reward doing nothing.
        raise ValueError(
            "expects blank output for every stdin/stdout test: a program that prints nothing passes"
        )
    return pairs


def _io_text(value: Any, index: int, which: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(line + "\n" for line in value)
    raise ValueError(
        f"stdin/stdout test {index}: the {which} must be a string (or a list of lines); got "
        f"{type(value).__name__} {str(value)[:40]!r}"
    )


def check_columns(columns: Mapping[str, str] | None) -> dict[str, str]:
    """`data.columns` as a plain dict, refused unless every key is one of FIELDS and every value a name."""
    columns = dict(columns or {})
    unknown = sorted(set(columns) - set(FIELDS))
    if unknown:
        raise ValueError(
            f"data.columns maps {unknown}, which are not problem fields; the fields are {list(FIELDS)} "
            "(write data.columns.FIELD=COLUMN, e.g. data.columns.prompt=question)"
        )
    for name, column in columns.items():
        if not isinstance(column, str) or not column:
            raise ValueError(f"data.columns.{name} must name a column of the data; got {column!r}")
    shared = sorted({c for c in columns.values() if list(columns.values()).count(c) > 1})
    if shared:
        raise ValueError(
            f"data.columns maps several fields to the column(s) {shared}; map each field to its own"
        )
    return columns


def _renamed(record: Any, columns: dict[str, str]) -> Any:
    """The record with `columns`' dataset names replaced by our field names."""
    if not columns or not isinstance(record, dict):
        return record  # problem_from_dict reports a record that is not an object
    missing = {f: c for f, c in columns.items() if c not in record}
    if missing:
        wanted = ", ".join(f"{f} -> {c!r}" for f, c in missing.items())
        raise ValueError(
            f"data.columns maps {wanted}, but there is no such column; columns present: {sorted(record)}"
        )
    taken = set(columns.values()) | set(columns)
    out = {k: v for k, v in record.items() if k not in taken}
    out.update({f: record[c] for f, c in columns.items()})
    return out


def load_problems(source: str | Path, columns: Mapping[str, str] | None = None) -> list[Problem]:
    """Problems from "bundled", a file, a saved `datasets` folder, a folder of files or a glob
    (`sources.py` says which is which), with `columns` mapping our field names to the data's."""
    mapping = check_columns(columns)
    problems, seen = [], set()
    for default_id, record, where in read_records(source):
        try:
            problem = problem_from_dict(_renamed(record, mapping), default_id)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None
        if problem.id in seen:
            raise ValueError(
                f"{where}: duplicate problem id {problem.id!r}; ids must be unique within a problem set"
            )
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise ValueError(f"{source}: contains no problems")
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
