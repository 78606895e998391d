"""Problems judged by stdin/stdout pairs, scored in the real bubblewrap sandbox: the program runs once
per pair with the input on stdin and passes a pair only by printing its expected output."""

import json

import pytest

from megatron_rl.cli.score import main
from megatron_rl.config.schema import RewardConfig
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.sandbox import find_bwrap
from megatron_rl.reward.stdio import same_output

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)

PAIRS = (("1 2\n", "3\n"), ("10 -4\n", "6\n"), ("100000 100000\n", "200000\n"))
ADD = Problem(id="add", prompt="read two integers, print their sum", io_tests=PAIRS, timeout_s=3.0)
CORRECT = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(RewardConfig(kind="sandbox", workers=2, timeout_s=3.0, mode="fraction")) as p:
        yield p


def _score(pool, code: str, problem: Problem = ADD):
    (result,) = pool.score([problem], [f"```python\n{code}```\n"], timeout=60)
    return result


def test_a_correct_program_passes_every_pair(pool):
    r = _score(pool, CORRECT)
    assert (r.status, r.reward, r.tests_passed, r.tests_total) == ("passed", 1.0, 3, 3), r.output_tail
    fast = "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\nsys.exit(0)\n"
    assert _score(pool, fast).status == "passed"


def test_a_wrong_program_fails(pool):
    r = _score(pool, "a, b = map(int, input().split())\nprint(a - b)\n")
    assert (r.status, r.reward, r.tests_passed) == ("failed", 0.0, 0)
    assert "test 1 failed: stdout line 1: expected '3', got '-1'" in r.output_tail


def test_hard_coding_the_first_answer_fails_the_others(pool):
    r = _score(pool, "print(3)\n")
    assert (r.status, r.tests_passed, r.tests_total) == ("failed", 1, 3)
    assert r.reward == pytest.approx(1 / 3)  # fraction: per pair


def test_state_does_not_carry_from_one_pair_to_the_next(pool):
    # a module-level counter restarts with every pair: each run is a fresh program
    counting = (
        "import builtins\nn = getattr(builtins, 'runs', 0)\nbuiltins.runs = n + 1\nprint([3, 6, 200000][n])\n"
    )
    assert _score(pool, counting).tests_passed == 1


def test_a_program_that_loops_forever_times_out(pool):
    r = _score(pool, "while True:\n    pass\n", Problem(id="loop", prompt="p", io_tests=PAIRS, timeout_s=1.0))
    assert (r.status, r.reward, r.tests_passed) == ("timeout", 0.0, 0)
    assert 1.0 <= r.seconds < 5.0


def test_a_program_that_hangs_on_one_pair_keeps_the_pairs_it_passed(pool):
    code = "a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)\n"
    r = _score(pool, code, Problem(id="hang", prompt="p", io_tests=PAIRS, timeout_s=1.0))
    assert (r.status, r.tests_passed, r.tests_total) == ("timeout", 1, 3)


def test_files_outside_the_sandbox_cannot_be_read(pool, tmp_path):
    secret = tmp_path / "answers.txt"
    secret.write_text("3\n")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    code = f"print(open({str(secret)!r}).read().strip())\n"
    r = _score(pool, code, Problem(id="leak", prompt="p", io_tests=(("", "3\n"),)))
    assert r.status == "failed" and r.reward == 0.0
    assert "No such file or directory" in r.output_tail


def test_no_network_and_memory_limits_hold(pool):
    net = (
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n    print('online')\n"
        "except OSError:\n    print('offline')\n"
    )
    assert _score(pool, net, Problem(id="net", prompt="p", io_tests=(("", "online\n"),))).status == "failed"
    hog = "x = bytearray(4 << 30)\nprint(3)\n"
    r = _score(pool, hog, Problem(id="hog", prompt="p", io_tests=(("1 2\n", "3\n"),)))
    assert r.status == "memory" and r.reward == 0.0


def test_a_crash_or_nonzero_exit_fails_the_pair_even_with_the_right_output(pool):
    r = _score(pool, "print(3)\nraise SystemExit(2)\n", Problem(id="exit", prompt="p", io_tests=PAIRS[:1]))
    assert r.status == "failed" and "exited with code 2" in r.output_tail
    assert _score(pool, "print(3\n").status == "syntax_error"


def test_the_comparison_ignores_trailing_whitespace_only():
    assert same_output("3  \r\n4\n\n\n", "3\n4")
    assert (
        not same_output(" 3\n", "3\n")
        and not same_output("3 4\n", "3  4\n")
        and not same_output("3\n\n4", "3\n4")
    )


def test_score_cli_on_an_apps_style_problem(tmp_path, capsys):
    problem = tmp_path / "P.json"
    io = {"inputs": [i for i, _ in PAIRS], "outputs": [o for _, o in PAIRS]}
    problem.write_text(json.dumps({"id": "add", "prompt": "sum", "input_output": json.dumps(io)}))
    completion = tmp_path / "C.txt"
    completion.write_text(f"Here:\n```python\n{CORRECT}```\n")
    assert main(["--problem", str(problem), "--completion", str(completion), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["reward"], out["tests_passed"], out["tests_total"]) == ("passed", 1.0, 3, 3)
    completion.write_text("print(3)\n")
    assert main(["--problem", str(problem), "--completion", str(completion), "--mode", "fraction"]) == 0
    assert "status failed, reward 0.333333, tests 1/3" in capsys.readouterr().out
