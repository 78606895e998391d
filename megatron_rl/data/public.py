"""Public problem sets as they ship: HumanEval, MBPP and APPS/TACO rows, read with no column mapping.

A record is recognised by its columns (a record with our own `tests` or `answer` is never one of
these), and becomes the fields of `problems.Problem`. How each family is graded, and where that
differs from its published harness:

HumanEval (openai/human-eval: `task_id, prompt, canonical_solution, test, entry_point`).
  The harness runs `exec(prompt + completion + "\n" + test + "\n" + f"check({entry_point})")`, all or
  nothing. Here: id = task_id, prompt = prompt; the prompt is also the problem's code (`prefix`),
  composed before the completion as the harness does (`data/extract.compose_program`: a bare body, a
  fenced full function and the entry point alone all run); tests = test, run as `check(entry_point)`
  with each assert of `check` a unit (partial credit under reward.mode=fraction; all_or_nothing is the
  harness's verdict). Names the tests read that the prompt defines (`poly`, `encode_cyclic`) come from
  the prompt, never from a completion that redefines them. The reference solution (prompt +
  canonical_solution) is kept as metadata `solution`.
MBPP (google-research/mbpp: `task_id, text, code, test_list, test_setup_code, challenge_test_list`;
  the sanitized set: `task_id, prompt, code, test_imports, test_list`).
  The harness runs `exec(code + "\n" + test_setup_code + "\n" + "\n".join(test_list))`. Here: id =
  task_id; prompt = the text, then "Your code should pass these tests:" and the asserts (the paper's
  prompt: the tests name the function and its arguments); tests = test_setup_code (or test_imports)
  and test_list, one unit per assert; the entry point (MBPP names none) is the one function the
  reference `code` defines that the tests call (MBPP 126 names it `sum`, over the built-in), else the
  one name the tests read that nothing else defines (testplan rule 6); the classes the reference
  defines that the tests construct (`Pair` in 601, `Node` in 367 and 927) are the problem's declared
  `interface`: the solution defines them too, and the tests call them, build objects with them and set
  their attributes. A constant of the reference (`MOD`) is never part of it. challenge_test_list is kept
  as metadata, not graded (the published evaluation uses test_list); `code` is kept as metadata
  `solution`.
APPS / TACO (`question, solutions, input_output, starter_code`; APPS adds `problem_id`).
  `input_output` (a JSON string or object) with `fn_name` is call-based: each case calls the function
  (`Solution().fn_name(*inputs)` when the starter code defines `class Solution`, else `fn_name(*inputs)`)
  and passes as in APPS's harness when the result, its tuples read as lists, equals the expected output,
  or the expected output's first element when that is a non-empty list (APPS wraps return values in a
  list). Each case is a unit. Without `fn_name` the cases are stdin/stdout pairs, judged by
  `reward/stdio.py`: exit status 0 and the same output up to trailing whitespace of each line and
  trailing blank lines. APPS's own harness is looser (it also accepts output equal after splitting on
  whitespace, or as numbers within a tolerance); a correct program that prints `1.0` for `1.000000`
  fails here. Both harnesses run every solution after a header of standard-library imports (`List`
  for a LeetCode signature, `gcd`, `deque`, ...): the problem's code (`prefix`) is that header (numpy,
  which they also import, is not in the sandbox) and then the starter code, so a completion may
  continue the starter or restate it. id = problem_id, else the row; prompt = the question, the
  starter code, and APPS's format line ("Use Call-Based format" / "Use Standard Input format");
  `solutions` (a JSON list of programs) is kept as metadata.
"""

from __future__ import annotations

import ast
import json
from typing import Any

MAX_CASE_BYTES = 6 << 20  # call-based cases travel inside the tests' plan: keep well under its frame
# The imports APPS's and TACO's harnesses put before every solution (module docstring).
APPS_HEADER = "\n".join(
    [
        "import sys, time, itertools, collections, math, fractions, random, heapq",
        "from itertools import accumulate, product, permutations, combinations",
        "from collections import Counter, OrderedDict, deque, defaultdict, ChainMap",
        "from functools import lru_cache",
        "from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2",
        "from typing import List, Tuple",
        "from heapq import *",
        "",
    ]
)


def family(record: dict) -> str | None:
    """Which public shape `record` has: "humaneval", "mbpp", "apps", or None (our own fields)."""
    keys = set(record)
    if "tests" in keys or "answer" in keys:
        return None
    if {"prompt", "test", "entry_point"} <= keys:
        return "humaneval"
    if "test_list" in keys and ("text" in keys or "prompt" in keys):
        return "mbpp"
    if {"question", "input_output"} <= keys and "prompt" not in keys:
        return "apps"
    return None


def to_fields(record: dict) -> dict:
    """A public record as our fields (id, prompt, tests or input_output, entry_point, prefix) plus its
    other columns, which become metadata; records of no public family come back unchanged."""
    kind = family(record)
    if kind == "humaneval":
        return _humaneval(record)
    if kind == "mbpp":
        return _mbpp(record)
    if kind == "apps":
        return _apps(record)
    return record


def _rest(record: dict, used: tuple[str, ...]) -> dict:
    return {k: v for k, v in record.items() if k not in used}


def _humaneval(r: dict) -> dict:
    out = _rest(r, ("task_id", "prompt", "test", "entry_point", "canonical_solution"))
    out.update(
        prompt=r["prompt"], tests=_text(r["test"], "test"), entry_point=r["entry_point"], prefix=r["prompt"]
    )
    if r.get("task_id") is not None:
        out["id"] = str(r["task_id"])
    if isinstance(r.get("canonical_solution"), str):
        out["solution"] = r["prompt"] + r["canonical_solution"]
    return out


def _mbpp(r: dict) -> dict:
    asserts = _lines(r["test_list"], "test_list")
    setup = r.get("test_setup_code") or ""
    imports = r.get("test_imports") or []
    setup_lines = [_text(setup, "test_setup_code")] if setup else _lines(imports, "test_imports")
    text = r.get("text") if isinstance(r.get("text"), str) else r.get("prompt")
    out = _rest(r, ("task_id", "text", "prompt", "code", "test_list", "test_setup_code", "test_imports"))
    out["prompt"] = f"{_text(text, 'text')}\nYour code should pass these tests:\n\n" + "\n".join(asserts)
    out["tests"] = "\n".join([*setup_lines, *asserts]) + "\n"
    if r.get("task_id") is not None:
        out["id"] = str(r["task_id"])
    if isinstance(r.get("code"), str):
        out["solution"] = r["code"]
        entry, interface = _called_definitions(r["code"], [*setup_lines, *asserts])
        if entry:
            out["entry_point"] = entry
        if interface:
            out["interface"] = interface
    return out


def _called_definitions(code: str, tests: list[str]) -> tuple[str | None, list[str]]:
    """(the one top-level function of `code` the tests call, the classes of `code` they call); (None,
    []) when that is not one function."""
    try:
        tree = ast.parse(code)
        called = {
            n.func.id
            for t in tests
            for n in ast.walk(ast.parse(t))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
    except (SyntaxError, ValueError):
        return None, []
    functions = sorted(s.name for s in tree.body if isinstance(s, ast.FunctionDef) and s.name in called)
    classes = sorted(s.name for s in tree.body if isinstance(s, ast.ClassDef) and s.name in called)
    return (functions[0], classes) if len(functions) == 1 else (None, [])


def _apps(r: dict) -> dict:
    io = r["input_output"]
    if isinstance(io, str):
        try:
            io = json.loads(io) if io.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"input_output is not valid JSON: {e}") from None
    if not isinstance(io, dict):
        raise ValueError(f"input_output must be an object with inputs and outputs; got {type(io).__name__}")
    starter = r.get("starter_code") or ""
    starter = _text(starter, "starter_code")
    fn_name = io.get("fn_name")
    out = _rest(r, ("problem_id", "question", "input_output", "starter_code", "solutions"))
    fmt = "Use Call-Based format" if fn_name else "Use Standard Input format"
    parts = (
        [_text(r["question"], "question").rstrip()] + ([starter.rstrip()] if starter.strip() else []) + [fmt]
    )
    out["prompt"] = "\n\n".join(parts)
    if fn_name:
        entry, call = call_target(fn_name, starter)
        out.update(tests=call_based_tests(io, call), entry_point=entry)
    else:
        out["input_output"] = io
    out["prefix"] = APPS_HEADER + starter
    if r.get("problem_id") is not None:
        out["id"] = str(r["problem_id"])
    solutions = r.get("solutions")
    if isinstance(solutions, str) and solutions.strip():
        try:
            solutions = json.loads(solutions)
        except json.JSONDecodeError:
            pass
    if solutions:
        out["solutions"] = solutions
    return out


def call_target(fn_name: Any, starter: str) -> tuple[str, str]:
    """(entry point, the expression a case calls) for APPS's call-based tests."""
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ValueError(f"input_output's fn_name must be a Python identifier; got {fn_name!r}")
    if "class Solution" in starter:  # LeetCode-style starter code: a method of Solution
        return "Solution", f"Solution().{fn_name}"
    return fn_name, fn_name


def call_based_tests(io: dict, call: str) -> str:
    """Python tests for APPS's call-based cases: one unit per case, compared as APPS's harness does."""
    ins, outs = io.get("inputs"), io.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
        raise ValueError("call-based input_output needs equally long, non-empty lists 'inputs' and 'outputs'")
    cases = [[args if isinstance(args, list) else [args], want] for args, want in zip(ins, outs)]
    data = json.dumps(cases)
    if len(data.encode()) > MAX_CASE_BYTES:
        raise ValueError(
            f"its call-based cases hold {len(data) / 2**20:.1f} MiB; at most {MAX_CASE_BYTES >> 20} MiB a problem"
        )
    lines = [
        "import json",
        f"_CASES = json.loads({data!r})",
        "",
        "def _listed(value):",
        "    if isinstance(value, (list, tuple)):",
        "        return [_listed(v) for v in value]",
        "    return value",
        "",
        "def _same(got, want):",
        "    got = _listed(got)",
        "    return got == want or (isinstance(want, list) and len(want) > 0 and got == want[0])",
        "",
        "def _case(i):",
        "    args, want = _CASES[i]",
        f"    got = {call}(*args)",
        "    assert _same(got, want), f'case {i}: expected {want!r:.200}, got {got!r:.200}'",
        "",
        *(f"_case({i})" for i in range(len(cases))),
    ]
    return "\n".join(lines) + "\n"


def _text(value: Any, column: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"column {column!r} must be a string; got {type(value).__name__}")
    return value


def _lines(value: Any, column: str) -> list[str]:
    if isinstance(value, str):  # a JSON-encoded list, as some exports store it
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"column {column!r} must be a list of strings")
    return value
