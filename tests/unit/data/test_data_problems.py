import json

import pytest

from megatron_rl.data.problems import load_problem, load_problems
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.testrunner import plan_tests


def test_bundled_set_is_large_valid_and_self_checked():
    problems = load_problems("bundled")
    assert len(problems) >= 50
    assert len({p.id for p in problems}) == len(problems)
    for p in problems:
        assert p.entry_point and p.prompt.strip()
        assert plan_tests(p.tests, p.entry_point).total >= 1
        assert p.entry_point in p.metadata["solution"]  # the reference solution the integration test runs


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_json_and_metadata(tmp_path):
    rec = {
        "id": "a",
        "prompt": "p",
        "tests": "assert f() == 1\n",
        "entry_point": "f",
        "timeout_s": 2,
        "difficulty": "easy",
    }
    jsonl = _write(tmp_path, "p.jsonl", json.dumps(rec) + "\n\n" + json.dumps({**rec, "id": "b"}) + "\n")
    problems = load_problems(jsonl)
    assert [p.id for p in problems] == ["a", "b"]
    assert problems[0].timeout_s == 2 and problems[0].metadata == {"difficulty": "easy"}
    single = _write(tmp_path, "one.json", json.dumps({k: v for k, v in rec.items() if k != "id"}))
    assert load_problem(single).id == "one-0"
    assert load_problem(jsonl, "b").id == "b"
    with pytest.raises(ValueError, match="choose one by id"):
        load_problem(jsonl)
    with pytest.raises(KeyError, match="zz"):
        load_problem(jsonl, "zz")


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"prompt": "p"', "p.jsonl:1: not valid JSON"),
        ('{"tests": "assert 1"}', "missing required key 'prompt'"),
        ('{"prompt": "p"}', "needs 'tests'"),
        ('{"prompt": "p", "tests": "assert f(1) =="}', "do not parse"),
        ('{"prompt": "p", "tests": "x = 1"}', "nothing to pass"),
        ('{"prompt": "p", "tests": "assert 1", "entry_point": "not valid"}', "identifier"),
        ('{"prompt": "p", "tests": "assert 1", "timeout_s": -1}', "positive"),
        ('{"prompt": "", "tests": "assert 1"}', "non-empty"),
    ],
)
def test_bad_records_name_the_file_line_and_problem(tmp_path, line, match):
    with pytest.raises(ValueError, match=match):
        load_problems(_write(tmp_path, "p.jsonl", line + "\n"))


def test_duplicate_ids_missing_files_and_unknown_types(tmp_path):
    rec = json.dumps({"id": "a", "prompt": "p", "tests": "assert 1\n"})
    with pytest.raises(ValueError, match="duplicate problem id 'a'"):
        load_problems(_write(tmp_path, "d.jsonl", rec + "\n" + rec + "\n"))
    with pytest.raises(FileNotFoundError, match="bundled"):
        load_problems(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="unsupported"):
        load_problems(_write(tmp_path, "p.csv", "prompt\n"))


def test_parquet_reads_with_pyarrow_or_says_how_to_get_it(tmp_path):
    path = tmp_path / "p.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(ImportError, match="pip install pyarrow"):
            load_problems(path)
        return
    pq.write_table(
        pa.Table.from_pylist([{"id": "q", "prompt": "p", "tests": "assert f() == 1\n", "entry_point": "f"}]),
        path,
    )
    assert load_problems(path)[0].entry_point == "f"


def test_problem_is_hashable_despite_metadata():
    p = Problem(id="a", prompt="p", tests="assert 1\n", metadata={"k": [1]})
    assert {p: 1}[p] == 1


@pytest.mark.parametrize("timeout", [1e10, 86400.5])
def test_a_problems_own_timeout_is_at_most_a_day(timeout):
    with pytest.raises(ValueError, match="at most 86400"):
        Problem(id="a", prompt="p", tests="assert 1\n", timeout_s=timeout)
    assert Problem(id="a", prompt="p", tests="assert 1\n", timeout_s=86400).timeout_s == 86400
