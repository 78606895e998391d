"""How tests split into units, and what the runner refuses to do with the solution's objects."""

import pytest

from megatron_rl.reward import testrunner


def test_top_level_asserts_are_units_and_the_rest_is_setup():
    plan = testrunner.plan_tests(
        "import math\nx = 2\nassert f(x) == 4\nfor i in range(3):\n    assert f(i) >= 0\n", "f"
    )
    assert [u.is_test for u in plan.units] == [False, False, True, True]
    assert plan.total == 2
    assert {"f", "range"} <= plan.names
    assert not {"x", "i", "math"} & plan.names  # the tests bind these: never taken from the solution


def test_test_functions_are_units():
    plan = testrunner.plan_tests(
        "def helper():\n    return 1\ndef test_a():\n    assert g() == 1\ndef test_b():\n    assert g() == 2\n",
        "g",
    )
    assert plan.total == 2
    assert [u.label for u in plan.units if u.is_test] == ["test_a()", "test_b()"]


def test_check_candidate_body_is_split_and_bound_to_the_entry_point():
    src = "def check(candidate):\n    r = candidate(1)\n    assert r == 1\n    assert candidate(2) == 4\n\ncheck(square)\n"
    plan = testrunner.plan_tests(src, "square")
    assert plan.candidate == "candidate"
    assert plan.total == 2
    assert not any("check(square)" in u.label for u in plan.units)  # the explicit call is not repeated


def test_check_with_return_runs_whole():
    plan = testrunner.plan_tests("def check(c):\n    if c(0):\n        return\n    assert c(1) == 1\n", "f")
    assert plan.total == 1


def test_check_without_entry_point_is_an_error():
    with pytest.raises(ValueError, match="entry_point"):
        testrunner.plan_tests("def check(candidate):\n    assert candidate(1)\n", None)


@pytest.mark.parametrize("src", ["x = 1\n", "print('hi')\n", ""])
def test_tests_without_asserts_are_refused(src):
    with pytest.raises(ValueError, match="nothing to pass"):
        testrunner.plan_tests(src, None)


def test_unparsable_tests_raise_syntax_error():
    with pytest.raises(SyntaxError):
        testrunner.plan_tests("assert f(1) ==\n", "f")


def _never(op):
    raise AssertionError(f"the solution must not be consulted, yet got {op!r}")


def test_solution_names_never_shadow_builtins_or_stdlib_modules():
    plan = testrunner.plan_tests(
        "import math\nassert len(f([1])) == 1 and math.isclose(1, 1) and helper()\n", "f"
    )
    ns = testrunner.bind_solution(plan, ["f", "len", "math", "helper", "unused"], {}, "f", _never)
    assert isinstance(ns["f"], testrunner.RemoteObject)
    assert isinstance(ns["helper"], testrunner.RemoteObject)
    assert "len" not in ns and "math" not in ns and "unused" not in ns


@pytest.mark.parametrize(
    "use",
    [
        lambda o: o == 1,
        lambda o: o != 1,
        lambda o: bool(o),
        lambda o: hash(o),
        lambda o: o < 1,
        lambda o: 1 in o,
    ],
    ids=["eq", "ne", "bool", "hash", "lt", "contains"],
)
def test_opaque_objects_refuse_comparison_without_asking_the_solution(use):
    obj = testrunner.RemoteObject(_never, {"h": 1}, "Rigged")
    with pytest.raises(TypeError, match="Rigged"):
        use(obj)


def test_remote_errors_map_to_builtin_exception_types_only():
    with pytest.raises(ValueError, match="bad"):
        testrunner.raise_remote("ValueError", "bad")
    with pytest.raises(testrunner.SolutionError, match="SystemExit"):
        testrunner.raise_remote("SystemExit", "0")
    with pytest.raises(testrunner.SolutionError):
        testrunner.raise_remote("MyError", "x")


def test_run_units_counts_passes_and_reports_failures():
    plan = testrunner.plan_tests("assert 1 == 1\nassert 1 == 2\nassert 2 == 2\n", None)
    outcome = testrunner.run_units(plan, {"__builtins__": __builtins__})
    assert (outcome.passed, outcome.total) == (2, 3)
    assert any("test 2 failed" in f for f in outcome.failures)


def test_a_set_up_failure_fails_the_problem_even_after_passing_tests():
    plan = testrunner.plan_tests("assert 1 == 1\nraise SystemExit(0)\nassert 2 == 2\n", None)
    outcome = testrunner.run_units(plan, {"__builtins__": __builtins__})
    assert (outcome.passed, outcome.total) == (0, 2)
    assert any("set-up (line 2) failed" in f and "SystemExit" in f for f in outcome.failures)


def test_top_level_data_is_bound_as_plain_values_and_objects_stay_remote():
    plan = testrunner.plan_tests(
        "assert isinstance(ans, int) and ans == 7 and table[2] == (1, 2) and obj\n", None
    )
    values = {"ans": 7, "table": {"$d": [[2, {"$t": [1, 2]}]]}, "bad": {"$zz": 1}}
    ns = testrunner.bind_solution(plan, ["ans", "table", "obj", "bad"], values, None, _never)
    assert ns["ans"] == 7 and type(ns["ans"]) is int and ns["table"] == {2: (1, 2)}
    assert isinstance(ns["obj"], testrunner.RemoteObject) and "bad" not in ns
