"""Public problem sets load as they ship, with no column mapping, from every file format (data/public.py)."""

import json

import pytest

from megatron_rl.data.problems import load_problems, problem_from_dict
from megatron_rl.data.public import APPS_HEADER, family
from tests.helpers.public_sets import APPS, HUMANEVAL, MBPP, MBPP_SANITIZED, MBPP_SHAPES, TACO, WRITERS

FAMILIES = {"humaneval": HUMANEVAL, "mbpp": MBPP + MBPP_SHAPES + MBPP_SANITIZED, "apps": APPS + TACO}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_each_row_is_recognised_by_its_columns(kind):
    assert {family(row) for row in FAMILIES[kind]} == {kind}
    assert family({"prompt": "p", "tests": "assert f(1)"}) is None  # our own fields win


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json", "parquet"])
def test_every_family_loads_from_every_file_format(tmp_path, fmt):
    """On main HumanEval's own .jsonl.gz was refused and every public row needed a column mapping."""
    write, suffix = WRITERS[fmt]
    for kind, rows in FAMILIES.items():
        loaded = [load_problems(write([r], tmp_path / f"{kind}{i}{suffix}"))[0] for i, r in enumerate(rows)]
        assert len(loaded) == len(rows)
        assert all(p.tests.strip() or p.io_tests for p in loaded)


def test_a_saved_datasets_folder_loads_too(tmp_path):
    (problem,) = load_problems(WRITERS["save_to_disk"][0](HUMANEVAL[:1], tmp_path / "he"))
    assert problem.id == "HumanEval/0" and problem.entry_point == "running_max"


def test_humaneval_rows_keep_the_prompt_as_the_problems_code():
    p = problem_from_dict(HUMANEVAL[1], "x")
    assert (p.id, p.entry_point, p.prompt, p.prefix) == (
        "HumanEval/1",
        "decode_shift",
        HUMANEVAL[1]["prompt"],
        HUMANEVAL[1]["prompt"],
    )
    assert p.tests == HUMANEVAL[1]["test"]
    assert p.metadata["solution"] == HUMANEVAL[1]["prompt"] + HUMANEVAL[1]["canonical_solution"]


def test_mbpp_rows_name_their_entry_point_through_the_tests():
    p = problem_from_dict(MBPP[1], "x")
    assert (p.id, p.entry_point) == ("602", "circle_area")
    assert p.tests.startswith("import math\n") and p.tests.count("assert ") == 3  # challenge tests kept aside
    assert p.metadata["challenge_test_list"] == [] and p.metadata["solution"] == MBPP[1]["code"]
    assert "Your code should pass these tests:" in p.prompt and "assert circle_area(0) == 0" in p.prompt
    sanitized = problem_from_dict(MBPP_SANITIZED[0], "x")
    assert (sanitized.id, sanitized.entry_point) == ("603", "second_smallest")


def test_mbpp_classes_the_tests_construct_are_the_declared_interface_and_constants_never_are():
    segments, tree, shadowing = (problem_from_dict(r, "x") for r in MBPP_SHAPES[:3])
    assert (segments.entry_point, segments.interface) == ("total_length", ("Segment",))
    assert (tree.entry_point, tree.interface) == ("count_leaves", ("Node",))  # built in test_setup_code
    assert (shadowing.entry_point, shadowing.interface) == ("sum", ())  # named over the built-in
    constant = {
        **MBPP[0],
        "code": "MOD = 3\ndef count_vowels(s):\n  return 1",
        "test_list": ["assert count_vowels('a') == 4 % MOD"],
    }
    with pytest.raises(ValueError, match="read `MOD`"):
        problem_from_dict(constant, "x")


def test_apps_rows_are_stdin_stdout_or_call_based_by_fn_name():
    stdio, call = (problem_from_dict(r, "x") for r in APPS)
    assert stdio.io_tests == (("1 2\n", "3\n"), ("10 -3\n", "7\n")) and stdio.prefix == APPS_HEADER
    assert "Use Standard Input format" in stdio.prompt
    assert (call.entry_point, call.prefix) == ("add_all", APPS_HEADER + APPS[1]["starter_code"])
    assert call.tests.count("\n_case(") == 3 and "Use Call-Based format" in call.prompt
    assert call.metadata["solutions"] == json.loads(APPS[1]["solutions"])
    taco = problem_from_dict(TACO[0], "taco-0")
    assert (
        taco.id == "taco-0"
        and taco.entry_point == "Solution"
        and "Solution().maxProduct(*args)" in taco.tests
    )


@pytest.mark.parametrize(
    "row, message",
    [
        ({**HUMANEVAL[0], "test": 7}, "'test' must be a string"),
        ({**MBPP[0], "test_list": [1, 2]}, "'test_list' must be a list of strings"),
        (
            {**MBPP[0], "test_list": ["assert count_vowels('a') == 1 and helper()"]},
            "read `helper`, which neither they",
        ),
        ({**APPS[0], "input_output": "{oops"}, "not valid JSON"),
        (
            {**APPS[1], "input_output": json.dumps({"fn_name": "x y", "inputs": [[1]], "outputs": [[1]]})},
            "identifier",
        ),
    ],
)
def test_malformed_public_rows_are_refused_with_the_reason(tmp_path, row, message):
    path = WRITERS["jsonl"][0]([row], tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=message) as e:
        load_problems(path)
    assert str(e.value).startswith(f"{path}:1:")


def test_a_damaged_gzip_file_is_a_clear_error(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="not readable as .jsonl.gz"):
        load_problems(path)
