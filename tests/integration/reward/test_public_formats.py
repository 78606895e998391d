"""Public sets as they ship, scored in the real sandbox, against a plain-Python oracle of their harnesses.

The oracle is each published harness's semantics written out here and run in a fresh interpreter,
with no sandbox and no proof (the completions are this file's own):
- HumanEval: exec(prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})");
- MBPP: exec(code + "\\n" + test_setup_code + "\\n" + asserts);
- APPS/TACO call-based: APPS's import header and the program, then each case's fn(*inputs) compared as
  APPS does (tuples as lists; equal to the output or to its first element); stdin/stdout: the program
  per case, its output equal up to whitespace (APPS also accepts more).
What must hold: every canonical solution passes both, in each shape a model answers in (a bare
continuation, a fenced full function, the entry point alone), and a wrong completion passes the grader
only where the oracle passes it too. The grader is stricter than the harnesses where they can be
fooled: a completion that redefines the prompt's helper, or its `math`, passes HumanEval's harness and
fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import load_problems
from megatron_rl.reward.extract import compose_program
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.sandbox import find_bwrap
from tests.helpers import public_sets as sets

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)


def _runs(program: str, stdin: str = "") -> tuple[bool, str]:
    """Whether `program` exits 0 in a fresh interpreter, and what it printed."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", program], input=stdin, capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return False, ""
    return done.returncode == 0, done.stdout


def oracle_humaneval(row: dict, completion: str) -> bool:
    program = row["prompt"] + completion + "\n" + row["test"] + "\n" + f"check({row['entry_point']})"
    return _runs(program)[0]


def oracle_mbpp(row: dict, completion: str) -> bool:
    setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
    return _runs(completion + "\n" + setup + "\n" + "\n".join(row["test_list"]))[0]


_APPS_CALL = """
import json
_g = {}
exec(compile(PROGRAM, "<solution>", "exec"), _g)
io = json.loads(IO)
fn = getattr(_g["Solution"](), io["fn_name"]) if CLASS else _g[io["fn_name"]]
for args, want in zip(io["inputs"], io["outputs"]):
    got = fn(*args)
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(got, list) and got and isinstance(got[0], tuple):
        got = [list(x) for x in got]
    assert got == want or (isinstance(want, list) and want and got == want[0]), (got, want)
"""


def oracle_apps(row: dict, program: str) -> bool:
    io = json.loads(row["input_output"])
    if io.get("fn_name"):
        checker = f"PROGRAM = {program!r}\nIO = {row['input_output']!r}\nCLASS = {'class Solution' in row['starter_code']}\n"
        return _runs(checker + _APPS_CALL)[0]
    for stdin, want in zip(io["inputs"], io["outputs"]):
        ok, out = _runs(program, stdin)
        if not ok or out.split() != want.split():
            return False
    return True


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """Each family from a different format: HumanEval .jsonl.gz, MBPP .json, APPS Parquet, TACO saved."""
    root = tmp_path_factory.mktemp("public")
    loaded = {
        "humaneval": load_problems(sets.write_jsonl_gz(sets.HUMANEVAL, root / "HumanEval.jsonl.gz")),
        "mbpp": load_problems(
            sets.write_json(sets.MBPP + sets.MBPP_SHAPES + sets.MBPP_SANITIZED, root / "mbpp.json")
        ),
        "apps": load_problems(sets.write_parquet(sets.APPS, root / "apps.parquet")),
        "taco": load_problems(sets.write_saved_dataset(sets.TACO, root / "taco")),
    }
    return {kind: {p.id: p for p in ps} for kind, ps in loaded.items()}


def _cases(problems) -> list[tuple]:
    """(problem, completion, the oracle's verdict as a thunk, or None for shapes only our composition
    runs; whether it is canonical)"""
    cases = []
    for row in sets.HUMANEVAL:
        p = problems["humaneval"][row["task_id"]]
        for shape, text in sets.humaneval_shapes(row).items():
            judge = (lambda r=row, t=text: oracle_humaneval(r, t)) if shape == "continuation" else None
            cases.append((p, text, judge, True))
        cases += [
            (p, w, lambda r=row, w=w: oracle_humaneval(r, w), False)
            for w in sets.HUMANEVAL_WRONG[row["task_id"]]
        ]
    for row in sets.MBPP + sets.MBPP_SHAPES + sets.MBPP_SANITIZED:
        p = problems["mbpp"][str(row["task_id"])]
        cases.append((p, f"```python\n{row['code']}\n```", lambda r=row: oracle_mbpp(r, r["code"]), True))
        cases += [
            (p, w, lambda r=row, w=w: oracle_mbpp(r, w), False) for w in sets.MBPP_WRONG[str(row["task_id"])]
        ]
    taco = [(sets.TACO[0], problems["taco"]["taco-0"], sets.TACO_WRONG)]
    apps = [
        (r, problems["apps"][str(r["problem_id"])], sets.APPS_WRONG[str(r["problem_id"])]) for r in sets.APPS
    ]
    for row, p, wrong in apps + taco:
        canonical = json.loads(row["solutions"])[0]
        for text, good in [(canonical, True), *((w, False) for w in wrong)]:
            program = compose_program(text, p.prefix, p.entry_point)
            cases.append((p, text, lambda r=row, g=program: oracle_apps(r, g), good))
    return cases


def test_canonical_solutions_pass_and_wrong_ones_pass_only_where_the_oracle_passes_them(problems):
    cases = _cases(problems)
    with ThreadPoolExecutor(2) as ex:  # the oracle's interpreters, two at a time (two cores here)
        verdicts = list(ex.map(lambda c: None if c[2] is None else c[2](), cases))
    with RewardPool(RewardConfig(kind="sandbox", workers=2, timeout_s=10.0)) as pool:
        results = pool.score([c[0] for c in cases], [c[1] for c in cases], timeout=300)
    stricter = []
    for (problem, text, _, canonical), oracle, result in zip(cases, verdicts, results):
        ours = result.status == "passed" and result.reward == 1.0
        where = f"{problem.id}: {text[:60]!r} -> {result.status} {result.output_tail[-300:]}"
        if canonical:
            assert ours, where
            assert oracle in (True, None), f"the oracle fails a canonical solution: {where}"
        elif ours:
            assert oracle is True, f"passed here, failed by the published harness: {where}"
        elif oracle:
            stricter.append(problem.id)
    # Where HumanEval's shared namespace lets a completion replace the prompt's helper or `math`, the
    # oracle passes it and the grader does not; APPS's list-wrapped output is accepted by both.
    assert {"HumanEval/1", "HumanEval/2"} <= set(stricter), stricter
    assert len(cases) >= 45 and sum(c[3] for c in cases) >= 20
