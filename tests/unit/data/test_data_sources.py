"""Problem sets as users hold them: Parquet, saved `datasets` folders, folders and globs of files,
column mapping, and stdin/stdout tests in the shapes public datasets use. Real files, real readers."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from megatron_rl.data.problems import load_problem, load_problems

PY = {"id": "sq", "prompt": "square it", "tests": "assert sq(3) == 9\n", "entry_point": "sq"}
IO = {"id": "add", "prompt": "add two numbers", "tests": [{"input": "1 2\n", "output": "3\n"}]}


def test_parquet_file_with_python_and_stdio_tests(tmp_path):
    path = tmp_path / "p.parquet"
    rows = [
        {**PY, "tests": PY["tests"], "pairs": None},
        {"id": "add", "prompt": "add", "tests": None, "pairs": [{"input": "1 2\n", "output": "3\n"}]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    sq, add = load_problems(path, {"input_output": "pairs"})
    assert sq.tests == PY["tests"] and sq.io_tests == () and sq.entry_point == "sq"
    assert add.tests == "" and add.io_tests == (("1 2\n", "3\n"),)


def test_saved_dataset_and_dataset_dict(tmp_path):
    Dataset.from_list([PY, {**PY, "id": "sq2"}]).save_to_disk(str(tmp_path / "ds"))
    assert [p.id for p in load_problems(tmp_path / "ds")] == ["sq", "sq2"]
    train, test = Dataset.from_list([PY]), Dataset.from_list([{**PY, "id": "other"}])
    DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    assert [p.id for p in load_problems(tmp_path / "dd")] == ["sq"]
    DatasetDict({"a": train, "b": test}).save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(ValueError, match=r"splits \['a', 'b'\] and no 'train'"):
        load_problems(tmp_path / "ab")


def test_folder_and_glob_go_through_load_dataset(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(2):
        (folder / f"part-{i}.jsonl").write_text(json.dumps({**PY, "id": f"sq{i}"}) + "\n")
    (folder / "README.md").write_text("not data")
    assert [p.id for p in load_problems(folder)] == ["sq0", "sq1"]
    for i in range(2):
        pq.write_table(pa.Table.from_pylist([{**PY, "id": f"pq{i}"}]), tmp_path / f"x-{i}.parquet")
    assert [p.id for p in load_problems(str(tmp_path / "x-*.parquet"))] == ["pq0", "pq1"]
    (folder / "extra.parquet").write_bytes((tmp_path / "x-0.parquet").read_bytes())
    with pytest.raises(ValueError, match="all of one format"):
        load_problems(folder)
    with pytest.raises(FileNotFoundError, match="matches no files"):
        load_problems(str(tmp_path / "nothing-*.jsonl"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no .jsonl"):
        load_problems(tmp_path / "empty")


def test_column_mapping(tmp_path):
    path = tmp_path / "apps.jsonl"
    record = {
        "problem_id": 7,
        "question": "sum",
        "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
    }
    path.write_text(json.dumps(record) + "\n")
    (p,) = load_problems(path, {"id": "problem_id", "prompt": "question"})
    assert p.id == "7" and p.prompt == "sum" and p.io_tests == (("1 2\n", "3\n"),)
    with pytest.raises(ValueError, match=r"not problem fields; the fields are \['id', 'prompt'"):
        load_problems(path, {"question": "prompt"})
    with pytest.raises(
        ValueError, match=r"prompt -> 'text'.*columns present: \['input_output', 'problem_id', 'question'\]"
    ):
        load_problems(path, {"prompt": "text"})
    with pytest.raises(ValueError, match="data.columns.prompt must name a column"):
        load_problems(path, {"prompt": ""})


def test_a_list_of_assert_strings_is_python_tests_one_unit_each(tmp_path):
    """MBPP's `test_list` shape mapped to `tests`: test statements, not stdin/stdout pairs."""
    from megatron_rl.reward.testrunner import plan_tests

    path = tmp_path / "mbpp_like.jsonl"
    row = {
        "task_id": 3,
        "question": "Write add(a, b).",
        "checks": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
    }
    path.write_text(json.dumps(row) + "\n")
    (p,) = load_problems(path, {"id": "task_id", "prompt": "question", "tests": "checks"})
    assert p.io_tests == () and p.tests == "assert add(1, 2) == 3\nassert add(0, 0) == 0\n"
    assert p.entry_point == "add" and plan_tests(p.tests, p.entry_point).total == 2
    # A list of objects stays stdin/stdout pairs; a list of both kinds is neither, and says so.
    assert load_problem(_one(tmp_path, IO)).io_tests == (("1 2\n", "3\n"),)
    mixed = {"prompt": "p", "tests": ["assert f() == 1", {"input": "1\n", "output": "2\n"}]}
    with pytest.raises(ValueError, match="mixing strings and other values"):
        load_problem(_one(tmp_path, mixed))


def _one(tmp_path, record) -> object:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    "record, hint",
    [
        (
            {"question": "q", "tests": "assert f() == 1"},
            "data.columns.prompt=<your column>, e.g. data.columns.prompt=question",
        ),
        ({"body": "q", "tests": "assert f() == 1"}, "data.columns.prompt=<your column>"),
        (
            {"prompt": "q", "test_code": "assert f() == 1"},
            "data.columns.tests=<your column>, e.g. data.columns.tests=test_code",
        ),
    ],
)
def test_a_missing_field_says_how_to_map_a_column_to_it(tmp_path, record, hint):
    with pytest.raises(ValueError, match="missing required key 'prompt'|needs 'tests'") as e:
        load_problem(_one(tmp_path, record))
    assert hint in str(e.value)


@pytest.mark.parametrize(
    "tests",
    [
        [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}],
        {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]},
        {"input": ["1 2\n", "5 5\n"], "output": ["3\n", "10\n"]},  # CodeContests public_tests
        json.dumps({"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}),  # APPS string, as tests
        {"inputs": [["1 2"], ["5 5"]], "outputs": [["3"], ["10"]]},  # lines, joined
    ],
)
def test_stdio_shapes(tmp_path, tests):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"prompt": "add", "tests": tests}))
    assert load_problem(path).io_tests == (("1 2\n", "3\n"), ("5 5\n", "10\n"))


@pytest.mark.parametrize(
    "record, message",
    [
        ({"prompt": "p", "input_output": {"inputs": [[1]], "outputs": [[2]], "fn_name": "1f"}}, "identifier"),
        ({"prompt": "p", "input_output": {"inputs": [[1]], "outputs": [], "fn_name": "f"}}, "equally long"),
        ({"prompt": "p", "tests": []}, "empty list of stdin/stdout tests"),
        ({"prompt": "p", "tests": [{"in": "1"}]}, "must be an object with 'input' and 'output'"),
        ({"prompt": "p", "tests": {"inputs": ["1"], "outputs": []}}, "1 inputs but 0 outputs"),
        ({"prompt": "p", "tests": [{"input": 1, "output": "2"}]}, "the input must be a string"),
        (
            {"prompt": "p", "tests": "assert 1", "input_output": {"inputs": [], "outputs": []}},
            "both 'tests' and 'input_output'",
        ),
        ({"prompt": "p", "inputs": ["1"], "outputs": ["2"]}, "look like stdin/stdout halves"),
        ({"prompt": "p", "input_output": "{not json"}, "must be JSON"),
    ],
)
def test_bad_stdio_records_are_refused_with_the_reason(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_problems(path)
    assert str(e.value).startswith(f"{path}:1:")


def test_damaged_parquet_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        load_problems(path)


def test_two_fields_cannot_share_one_column(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "Write f.", "test_code": "assert f() == 1"}) + "\n")
    with pytest.raises(ValueError, match="several fields to the column"):
        load_problems(path, {"prompt": "question", "tests": "question"})


def test_stdin_stdout_tests_that_expect_nothing_are_refused(tmp_path):
    """A program that prints nothing would pass them: a grader that pays for doing nothing."""
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": "Read a line.", "tests": [{"input": "1\n", "output": "\n  \n"}]}) + "\n"
    )
    with pytest.raises(ValueError, match="blank output"):
        load_problems(path)
