"""The unit semantics of `testplan`: which statements are units, what is set-up, and what is refused."""

import json

import pytest

from megatron_rl.reward import testrunner
from megatron_rl.reward.testplan import TestShapeError, plan_tests


def _tests(plan):
    return [u.label for u in plan.units if u.is_test]


def test_every_top_level_statement_is_a_step_in_source_order():
    plan = plan_tests("import math\nprint(f(0))\nassert f(1) == 2\ny = f(3)\nassert y == 4\n", "f")
    assert [(u.line, u.is_test) for u in plan.units] == [
        (1, False),
        (2, False),
        (3, True),
        (4, False),
        (5, True),
    ]


def test_main_block_is_hoisted_and_unittest_main_dropped():
    src = "import unittest\nif __name__ == '__main__':\n    assert f(1) == 2\n    unittest.main()\n"
    assert _tests(plan_tests(src, "f")) == ["assert f(1) == 2"]
    with pytest.raises(TestShapeError, match="else branch"):
        plan_tests("if __name__ == '__main__':\n    assert f(1)\nelse:\n    pass\n", "f")


def test_a_call_of_an_asserting_helper_is_a_unit_and_the_def_is_not():
    src = "def inner():\n    assert f(1) == 2\ndef outer():\n    inner()\nouter()\nx = 1\n"
    plan = plan_tests(src, "f")
    assert _tests(plan) == ["outer()"] and plan.total == 1


def test_test_functions_run_after_the_top_level_unless_called_there():
    src = "def test_b():\n    assert f(2)\ndef test_a():\n    assert f(1)\nassert f(0) == 0\ntest_a()\n"
    assert _tests(plan_tests(src, "f")) == ["assert f(0) == 0", "test_a()", "test_b()"]


def test_check_is_split_only_when_its_body_is_flat_and_its_call_plain():
    heval = "def check(candidate):\n    r = candidate(1)\n    assert r == 2\n    assert candidate(2) == 3\n"
    plan = plan_tests(heval + "check(f)\n", "f")
    assert plan.candidate == "candidate" and _tests(plan) == ["assert r == 2", "assert candidate(2) == 3"]
    assert "r" not in plan.names  # the split body's own names stay the tests'
    whole = plan_tests(heval + "check(lambda x: x + 1)\n", "f")
    assert whole.candidate is None and _tests(whole) == ["check(lambda x: x + 1)"]
    returns = plan_tests("def check(c):\n    if c(0):\n        return\n    assert c(1) == 1\n", "f")
    assert _tests(returns) == ["check(f)"]


def test_unittest_methods_include_those_of_tests_defined_bases():
    src = (
        "import unittest\nclass Base(unittest.TestCase):\n    def test_base(self):\n        self.assertTrue(f(1))\n"
        "class More(Base):\n    def test_more(self):\n        self.assertTrue(f(2))\n"
    )
    assert _tests(plan_tests(src, "f")) == ["Base.test_base", "More.test_base", "More.test_more"]


@pytest.mark.parametrize(
    ("src", "match"),
    [
        ("import numpy\nassert f(1)\n", "not in the standard library"),
        ("from .x import y\nassert f(1)\n", "relative import"),
        ("assert (f(1), 'm')\n", "always true"),
        ("try:\n    assert f(1)\nexcept:\n    pass\n", "without re-raising"),
        ("try:\n    assert f(1)\nexcept (ValueError, AssertionError):\n    print(1)\n", "without re-raising"),
        ("def test_a():\n    yield\n", "generator"),
        ("def test_a(x):\n    assert f(x)\n", "fixtures"),
        (
            "import unittest\nclass T(unittest.TestCase):\n    def test_a(self, x):\n        pass\n",
            "fixtures",
        ),
        ("def check(candidate):\n    yield\n    assert candidate(1)\n", "generator"),
        ("def check(a, b):\n    assert a(b)\n", "one required argument"),
        ("def test_a():\n    assert f(1)\ndef test_a():\n    pass\n", "defined twice"),
        ("f = lambda x: x\nassert f(1)\n", "under test"),
        ("for f in [abs]:\n    assert f(1)\n", "under test"),
        ("def helper():\n    assert f(1)\nassert f(2)\n", "never called"),
        ("x = 1\n", "nothing to pass"),
        ("return 1\n", "outside function"),
    ],
)
def test_unjudgeable_shapes_are_refused_with_their_line(src, match):
    with pytest.raises(TestShapeError, match=match) as info:
        plan_tests(src, "f")
    assert str(info.value).startswith("tests line ")


@pytest.mark.parametrize(
    "src",
    [
        "try:\n    assert f(1)\nexcept AssertionError:\n    raise\n",  # re-raises
        "try:\n    f(-1)\n    assert False\nexcept ValueError:\n    pass\n",  # expects an exception
        "from collections import Counter\nassert Counter(f(1)) == Counter()\n",
        "def helper(f):\n    return f(1)\nassert helper(f) == 2\n",  # a parameter named like the entry point
    ],
)
def test_judgeable_shapes_are_accepted(src):
    assert plan_tests(src, "f").total == 1


def _run(src, namespace_extra):
    plan = plan_tests(src, "f")
    ns = testrunner.bind_solution(plan, [], {}, "f", lambda op: None)
    ns.update(namespace_extra)
    return testrunner.run_units(plan, ns)


def test_stop_iteration_from_a_mapped_function_fails_instead_of_ending_the_iteration():
    def raises(_):
        raise StopIteration

    outcome = _run("assert all(map(f, [1, 2]))\nassert not list(filter(f, [3]))\n", {"f": raises})
    assert (outcome.passed, outcome.total) == (0, 2)
    assert all("RuntimeError" in line for line in outcome.failures)
    with pytest.raises(testrunner.SolutionError, match="StopIteration"):
        testrunner.raise_remote("StopIteration", "")


def test_test_functions_must_return_none_and_async_ones_run():
    src = "def test_returns():\n    return f(1) == 2\nasync def test_async():\n    assert f(1) == 2\n"
    outcome = _run(src, {"f": lambda x: x + 1})
    assert (outcome.passed, outcome.total) == (1, 2)
    assert "instead of None" in outcome.failures[0]


def test_unittest_cases_pass_only_when_unittest_saw_them_pass():
    src = (
        "import unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        self.assertEqual(f(1), 2)\n"
        "    def test_bad(self):\n        self.assertEqual(f(1), 3)\n    @unittest.skip('later')\n"
    )
    src = src.rsplit("    @unittest", 1)[0]
    outcome = _run(src, {"f": lambda x: x + 1})
    assert (outcome.passed, outcome.total) == (1, 2)


def test_a_plan_survives_the_trip_from_the_host_to_the_runner():
    from megatron_rl.reward.testplan import plan_from_wire, plan_to_wire

    plan = plan_tests("def check(candidate):\n    assert candidate(1) == 2\n", "f")
    back = plan_from_wire(json.loads(json.dumps(plan_to_wire(plan))))
    assert (back.names, back.candidate, back.total) == (plan.names, plan.candidate, plan.total)
    assert [(u.label, u.is_test, u.line, u.code) for u in back.units] == [
        (u.label, u.is_test, u.line, u.code) for u in plan.units
    ]
