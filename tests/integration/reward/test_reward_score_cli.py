"""`megatron-rl score` on one case."""

import json

import pytest

from megatron_rl.reward.cli import main
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
