"""What the runner binds for the tests, and what it refuses to do with the solution's objects."""

import pytest

from megatron_rl.reward import testrunner
from megatron_rl.reward.testrunner import RemoteObject, apply_mutations, bind_solution, plan_tests, write_back


def _never(op):
    raise AssertionError(f"the solution must not be consulted, yet got {op!r}")


def test_only_the_entry_point_is_taken_from_the_solution():
    plan = plan_tests("import math\nassert len(f([1])) == 1 and math.isclose(1, 1)\n", "f")
    ns = bind_solution(plan, ["f", "len", "math", "helper", "MOD", "check", "exit"], {}, _never)
    assert isinstance(ns["f"], RemoteObject)
    assert not {"len", "math", "helper", "MOD", "check"} & set(ns)
    assert ns["exit"] is not _never and ns["exit"] is ns["quit"]  # the runner's own, raising SystemExit
    with pytest.raises(SystemExit):
        ns["exit"](1)


def test_an_entry_point_that_is_data_is_bound_as_its_plain_value():
    plan = plan_tests("assert ans == 7\n", "ans")
    assert bind_solution(plan, ["ans"], {"ans": 7}, _never)["ans"] == 7
    assert "ans" not in bind_solution(plan, ["ans"], {"ans": {"$zz": 1}}, _never)  # malformed: unbound


def test_a_missing_entry_point_fails_every_unit_before_any_runs():
    """On main the tests met a KeyError from the solution they could catch (`except KeyError`)."""
    plan = plan_tests("try:\n    r = f(1)\nexcept KeyError:\n    r = 2\nassert r == 2\n", "f")
    outcome = testrunner.run_units(plan, bind_solution(plan, ["g"], {}, _never))
    assert (outcome.passed, outcome.total) == (0, 1) and "does not define `f`" in outcome.failures[0]


def test_the_problems_code_runs_first_and_its_stub_never_replaces_the_entry_point():
    prefix = "def helper(x):\n    return x * 10\ndef f(x):\n    '''stub'''\n"
    plan = plan_tests("assert f(2) == helper(2) + 1\n", "f", prefix)
    ns = bind_solution(plan, [], {}, _never)
    ns["f"] = lambda x: x * 10 + 1
    assert testrunner.run_units(plan, ns).passed == 1
    broken = plan_tests("assert f(2) == helper(2)\n", "f", "def helper(x):\n    return 1 / 0\nhelper(1)\n")
    outcome = testrunner.run_units(broken, {**bind_solution(broken, [], {}, _never), "f": abs})
    assert outcome.passed == 0 and "the problem's code raised ZeroDivisionError" in outcome.failures[0]


@pytest.mark.parametrize(
    "use",
    [lambda o: o == 1, lambda o: o != 1, lambda o: bool(o), lambda o: hash(o), lambda o: o < 1],
    ids=["eq", "ne", "bool", "hash", "lt"],
)
def test_opaque_objects_refuse_comparison_without_asking_the_solution(use):
    obj = RemoteObject(_never, {"h": 1}, "Rigged")
    with pytest.raises(TypeError, match="Rigged"):
        use(obj)


class _Inconsistent:
    """A solution's object answering each protocol question as a hacker would (issue class C)."""

    def __init__(self):
        self.asked = []

    def __call__(self, op):
        self.asked.append(op[0])
        if op[0] == "list":
            return [3, 1, 2] if self.asked.count("list") == 1 else [1, 2, 3]
        if op[0] == "len":
            return 99
        if op[0] == "getitem":
            return 0
        raise AssertionError(op)


def test_a_returned_object_answers_iteration_length_and_indexing_from_one_materialisation():
    solution = _Inconsistent()
    obj = RemoteObject(solution, {"h": 1}, "Weird")
    assert list(obj) == [3, 1, 2] and list(obj) == [3, 1, 2]  # asked once, then answered here
    assert len(obj) == 3 and obj[0] == 3 and obj[1:] == [1, 2] and 2 in obj and 9 not in obj
    assert solution.asked == ["list"]
    with pytest.raises(TypeError, match="index only by int or slice"):
        obj["key"]
    with pytest.raises(AssertionError):  # the stand-in answers no "get"; the object is asked again after
        _ = obj.sort
    assert list(obj) == [1, 2, 3] and solution.asked == ["list", "get", "list"]


def test_a_returned_objects_truth_is_the_one_it_came_with_and_attributes_can_be_set():
    """MBPP tests `assert text_match(s)` on an re.Match; trees are built with `root.left = Node(2)`."""
    asked = []
    match = RemoteObject(lambda op: asked.append(op), {"h": 1}, "Match", truth=True)
    assert bool(match) and not RemoteObject(_never, {"h": 2}, "Match", truth=False) and asked == []
    match.left = 5
    assert asked == [["set", {"h": 1}, "left", 5]]
    with pytest.raises(TypeError, match="special attributes"):
        match.__class__ = int


def test_remote_errors_map_to_builtin_exception_types_only():
    with pytest.raises(ValueError, match="bad"):
        testrunner.raise_remote("ValueError", "bad")
    with pytest.raises(testrunner.SolutionError, match="SystemExit"):
        testrunner.raise_remote("SystemExit", "0")
    with pytest.raises(testrunner.SolutionError):
        testrunner.raise_remote("MyError", "x")


def test_mutated_arguments_are_written_back_in_place():
    inner = [1, 2]
    xs, d, s, ba = [inner, 5], {"a": [1], "b": 2}, {1}, bytearray(b"ab")
    write_back(xs, [[1, 2, 3], 6])
    write_back(d, {"a": [1, 9], "c": 3})
    write_back(s, {7, 8})
    write_back(ba, bytearray(b"zz"))
    assert xs == [[1, 2, 3], 6] and xs[0] is inner  # the nested list kept its identity
    assert d == {"a": [1, 9], "c": 3} and s == {7, 8} and ba == bytearray(b"zz")
    shrunk = [1, 2, 3]
    write_back(shrunk, [])
    assert shrunk == []


def test_a_mutation_report_cannot_change_what_a_function_could_not():
    """Immutable arguments, other types and other arities are ignored: no more power than mutating."""
    t, n, xs = (1, [2]), 5, [1]
    write_back(t, (9, [3]))
    write_back(n, 6)
    write_back(xs, {"now": "a dict"})
    assert t == (1, [3]) and n == 5 and xs == [1]  # only the tuple's inner list could change
    args = [[1], 2]
    apply_mutations(args, {}, [[[1, 2]], {"$d": []}], lambda h: None)  # one argument reported for two
    assert args == [[1], 2]
    with pytest.raises(testrunner.SolutionGone):
        apply_mutations(args, {}, "garbage", lambda h: None)


def test_run_units_counts_passes_and_reports_failures():
    plan = plan_tests("assert 1 == 1\nassert 1 == 2\nassert 2 == 2\n", None)
    outcome = testrunner.run_units(plan, {"__builtins__": __builtins__})
    assert (outcome.passed, outcome.total) == (2, 3)
    assert any("test 2 failed" in f for f in outcome.failures)


def test_a_set_up_failure_fails_the_problem_even_after_passing_tests():
    plan = plan_tests("assert 1 == 1\nraise SystemExit(0)\nassert 2 == 2\n", None)
    outcome = testrunner.run_units(plan, {"__builtins__": __builtins__})
    assert (outcome.passed, outcome.total) == (0, 2)
    assert any("set-up (line 2) failed" in f and "SystemExit" in f for f in outcome.failures)
