"""`megatron-rl score` on bad input: one line on stderr, exit 2, never a traceback; echoed text escaped."""

import json
import subprocess
import sys

import pytest

from megatron_rl.cli.score import main, printable


@pytest.fixture
def files(tmp_path):
    problem = tmp_path / "P.json"
    problem.write_text(
        json.dumps({"id": "a", "prompt": "p", "tests": "assert f(1) == 2\n", "entry_point": "f"})
    )
    completion = tmp_path / "C.txt"
    completion.write_text("def f(x):\n    return x + 1\n")
    return str(problem), str(completion)


@pytest.mark.parametrize(
    "flag",
    [
        ["--timeout-s", "nan"],
        ["--timeout-s", "inf"],
        ["--timeout-s", "-inf"],
        ["--timeout-s", "0"],
        ["--timeout-s", "-1"],
        ["--timeout-s", "soon"],
        ["--memory-mb", "0"],
        ["--memory-mb", "-5"],
        ["--memory-mb", "1.5"],
        ["--timeout-s", "1e10"],  # past a day: on main it ended in an OverflowError traceback
        ["--memory-mb", str(10**8)],  # past this machine's memory (and any host's)
        ["--workers", "0"],
        ["--mode", "generous"],
    ],
    ids=lambda f: " ".join(f),
)
def test_bad_limits_are_refused_in_one_line(files, capsys, flag):
    problem, completion = files
    assert main(["--problem", problem, "--completion", completion, *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("megatron-rl score: ") and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"prompt": "p", "tests": "def test_f(tmp_path):\n    assert f(1) == 2\n"}, "tests line 1"),
        ({"prompt": "p", "tests": "assert f(1) == 2\n", "timeout_s": float("nan")}, "finite"),
        ({"prompt": "p", "input_output": {"inputs": ["1"], "outputs": []}}, "stdin/stdout"),
        ({"id": "\x1b[32mok", "prompt": "p", "tests": "assert f(1) =="}, "\\x1b[32mok"),
    ],
)
def test_bad_problems_are_refused_in_one_line_with_control_characters_escaped(
    tmp_path, capsys, files, record, match
):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(record))
    assert main(["--problem", str(path), "--completion", files[1]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "\x1b" not in err and "Traceback" not in err, err


def test_the_real_command_exits_2_without_a_traceback(files):
    problem, completion = files
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_rl.cli",
            "score",
            "--problem",
            problem,
            "--completion",
            completion,
            "--timeout-s",
            "nan",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "finite" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2K\r\x1b[32mstatus passed\x1b[0m", "\\x1b[2K\\r\\x1b[32mstatus passed\\x1b[0m"),
        ("a\u202egnp.exe", "a\\u202egnp.exe"),  # a bidi override reorders what the terminal shows
        ("\x9b31m", "\\x9b31m"),  # the one-byte C1 control sequence introducer
        ("line\n\ttabbed é 中", "line\n\ttabbed é 中"),  # newlines, tabs and letters stay
    ],
)
def test_printable_escapes_control_and_format_characters(raw, shown):
    assert printable(raw) == shown
