"""The unit semantics of `testplan`: which statements are units, what is set-up, how names resolve,
and what is refused at load."""

import json

import pytest

from megatron_rl.reward.testplan import TestShapeError, plan_from_wire, plan_tests, plan_to_wire


def _tests(plan):
    return [u.label for u in plan.units]


def _kinds(plan):
    return [(s.line, s.kind) for s in plan.steps]


def test_every_top_level_statement_is_a_step_in_source_order():
    plan = plan_tests("import math\nprint(f(0))\nassert f(1) == 2\ny = f(3)\nassert y == 4\n", "f")
    assert _kinds(plan) == [(1, "setup"), (2, "setup"), (3, "unit"), (4, "setup"), (5, "unit")]


def test_main_block_is_hoisted_and_unittest_main_dropped():
    src = "import unittest\nif __name__ == '__main__':\n    assert f(1) == 2\n    unittest.main()\n"
    assert _tests(plan_tests(src, "f")) == ["assert f(1) == 2"]
    with pytest.raises(TestShapeError, match="else branch"):
        plan_tests("if __name__ == '__main__':\n    assert f(1)\nelse:\n    pass\n", "f")


def test_a_call_of_an_asserting_helper_is_a_unit_wherever_it_sits_in_the_statement():
    src = "def inner(x):\n    assert f(x) > 0\ndef outer():\n    inner(1)\nouter()\nx = 1\nfor v in f(3):\n    inner(v)\n"
    plan = plan_tests(src, "f")
    # the loop over the solution's result calls an asserting helper: a unit (on main it was set-up, so an
    # empty result passed it silently)
    assert _tests(plan) == ["outer()", "for v in f(3):"]
    (outer, loop) = plan.units
    assert outer.lexical == set() and outer.attributed  # reaches inner's assert through outer
    assert loop.lexical == set() and loop.attributed


def test_test_functions_run_after_the_top_level_unless_called_there():
    src = "def test_b():\n    assert f(2)\ndef test_a():\n    assert f(1)\nassert f(0) == 0\ntest_a()\n"
    assert _tests(plan_tests(src, "f")) == ["assert f(0) == 0", "test_a()", "test_b()"]


def test_check_is_split_in_its_own_frame_only_when_flat_plain_and_used_once():
    heval = "def check(candidate):\n    r = candidate(1)\n    assert r == 2\n    assert candidate(2) == 3\n"
    plan = plan_tests(heval + "check(f)\n", "f")
    assert _tests(plan) == ["assert r == 2", "assert candidate(2) == 3"]
    assert [s.kind for s in plan.steps] == ["setup", "check"]  # one call of check runs both units
    implicit = plan_tests(heval, "f")
    assert [s.kind for s in implicit.steps] == ["setup", "check"] and implicit.total == 2
    whole = plan_tests(heval + "check(lambda x: x + 1)\n", "f")
    assert _tests(whole) == ["check(lambda x: x + 1)"]
    returns = plan_tests("def check(c):\n    if c(0):\n        return\n    assert c(1) == 1\n", "f")
    assert _tests(returns) == ["check(f)"]
    called_elsewhere = plan_tests(heval + "def run():\n    check(f)\nrun()\n", "f")
    assert _tests(called_elsewhere) == ["run()", "check(f)"]  # not split: its units would run twice


def test_unittest_methods_include_those_of_tests_defined_bases():
    src = (
        "import unittest\nclass Base(unittest.TestCase):\n    def test_base(self):\n        self.assertTrue(f(1))\n"
        "class More(Base):\n    def test_more(self):\n        self.assertTrue(f(2))\n"
    )
    assert _tests(plan_tests(src, "f")) == ["Base.test_base", "More.test_base", "More.test_more"]


@pytest.mark.parametrize(
    "head, base",
    [
        ("from unittest import TestCase as TC", "TC"),
        ("import unittest as ut", "ut.TestCase"),
        ("import unittest\nCase = unittest.TestCase", "Case"),
        ("from unittest import IsolatedAsyncioTestCase", "IsolatedAsyncioTestCase"),
    ],
)
def test_a_testcase_base_under_an_alias_is_still_a_testcase(head, base):
    """On main these classes were no cases: their methods never ran and the other tests alone counted."""
    src = f"{head}\nclass Checks({base}):\n    def test_a(self):\n        self.assertEqual(f(1), 2)\n"
    assert _tests(plan_tests(src, "f")) == ["Checks.test_a"]


def test_names_resolve_to_the_tests_the_problem_builtins_stdlib_or_the_entry_point():
    prefix = "import math\ndef helper(x):\n    return x * 2\ndef f(x):\n    '''the stub'''\n"
    plan = plan_tests(
        "assert f(2) == helper(2) + math.floor(0.5) + len('') + int(statistics.mean([0]))\n", "f", prefix
    )
    assert plan.prefix is not None  # the tests read helper and math from the problem's code
    assert plan.imports == ["statistics"]  # read, never imported: the runner imports it
    assert plan_tests("assert f(2) == 3\n", "f", prefix).prefix is None  # nothing read from it


@pytest.mark.parametrize(
    "src, name",
    [
        ("assert f(10) == 10 % MOD\n", "MOD"),  # a constant the tests never define
        ("assert f(1) == 2 and g(1) == 3\n", "g"),  # a second function of the solution
        ("def test_a():\n    assert f(1) == helper(1)\n", "helper"),
        (
            "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(f(1), K)\n",
            "K",
        ),
    ],
)
def test_a_name_only_the_solution_could_define_is_refused(src, name):
    with pytest.raises(
        TestShapeError, match=f"read `{name}`, which neither they nor the problem's code define"
    ):
        plan_tests(src, "f")


def test_without_an_entry_point_the_one_free_name_is_it():
    assert plan_tests("assert add(1, 2) == 3\nassert add(0, 0) == 0\n", None).entry_point == "add"
    assert plan_tests("import math\nassert math.floor(1.5) == 1\n", None).entry_point is None
    with pytest.raises(TestShapeError, match="only one name, the entry point"):
        plan_tests("assert add(1, 2) == sub(5, 2)\n", None)


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
        # new: shapes whose asserts could never count
        ("def verify():\n    assert f(1) == 2\nchecks = [verify]\nassert checks\n", "never called"),
        (
            "import unittest\nclass T(unittest.TestCase):\n    pass\ndef _t(self):\n    self.assertEqual(f(1), 2)\n"
            "setattr(T, 'test_a', _t)\nassert f is not None\n",
            "never called",
        ),
        (
            "import sys, unittest\nclass T(unittest.TestCase):\n    if sys.version_info > (3,):\n"
            "        def test_a(self):\n            self.assertEqual(f(1), 2)\n    def test_b(self):\n"
            "        self.assertTrue(True)\n",
            "never called",
        ),
        ("def test_f():\n    return f(1) == 2\n", "contains no assertion"),
        (
            "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        return f(1) == 2\n",
            "contains no assertion",
        ),
        ("__mrl_start__ = 1\nassert f(1)\n", "reserves for itself"),
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
        "if f(1) != 2:\n    raise AssertionError('wrong')\n",  # a guard
        "from math import *\nassert f(1) == floor(2.5)\n",  # a star import binds what the module exports
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        if f(1) != 2:\n            self.fail()\n",
    ],
)
def test_judgeable_shapes_are_accepted(src):
    assert plan_tests(src, "f").total == 1


def test_tests_are_compiled_without_the_planners_own_future_flags():
    """testplan has `from __future__ import annotations`; inherited, the tests' annotations would be
    strings and an annotation that fails in Python (here at definition) would pass."""
    plan = plan_tests("def helper(x: int.nope):\n    return x\nassert helper(1) == 1\n", None)
    with pytest.raises(AttributeError):
        exec(plan.steps[0].code, {"__builtins__": __builtins__})


def test_a_plan_survives_the_trip_from_the_host_to_the_runner():
    prefix = "def helper(x):\n    return x\n"
    plan = plan_tests("def check(candidate):\n    assert candidate(1) == helper(1)\n", "f", prefix)
    back = plan_from_wire(json.loads(json.dumps(plan_to_wire(plan))))
    assert (back.entry_point, back.total, back.site_lines, back.imports) == (
        plan.entry_point,
        plan.total,
        plan.site_lines,
        plan.imports,
    )
    assert back.prefix == plan.prefix and back.units == plan.units
    assert [(s.code, s.kind, s.unit, s.label, s.line) for s in back.steps] == [
        (s.code, s.kind, s.unit, s.label, s.line) for s in plan.steps
    ]
