"""The proof a unit needs (`proof.py`, rules 1-6), each rule against the input that would fool it.

In-process: the entry point is a plain Python function standing in for the solution, so each case
costs microseconds; the same shapes run in the real sandbox in tests/integration/reward.
"""

import sys

import pytest

from megatron_rl.reward import testrunner
from megatron_rl.reward.testplan import plan_tests


def _run(src, f, prefix=""):
    plan = plan_tests(src, "f", prefix)
    ns = testrunner.bind_solution(plan, [], {}, lambda op: None)
    ns["f"] = f
    return testrunner.run_units(plan, ns)


def inc(x):
    return x + 1


def zero(x):
    return 0


# (tests, a wrong solution that passes them on main, an honest one or None when none can pass)
FOOLED = {
    # rule 2: an AssertionError passing through the tests' code, caught there
    "self.fail under except Exception": (
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        try:\n"
        "            self.assertEqual(f(1), 2)\n        except Exception:\n            pass\n",
        zero,
        inc,
    ),
    "an alias of AssertionError": (
        "AE = AssertionError\nfor _ in [0]:\n    try:\n        assert f(1) == 2\n    except AE:\n        pass\n",
        zero,
        inc,
    ),
    "an alias of suppress": (
        "from contextlib import suppress as quietly\nwith quietly(AssertionError):\n    assert f(1) == 2\n",
        zero,
        inc,
    ),
    "a conditional re-raise": (
        "try:\n    assert f(1) == 2\nexcept AssertionError as e:\n    if 'never' in str(e):\n        raise\n",
        zero,
        inc,
    ),
    "a context manager of the tests": (
        "class Quiet:\n    def __enter__(self):\n        return self\n    def __exit__(self, *a):\n        return True\n"
        "with Quiet():\n    assert f(1) == 2\n",
        zero,
        inc,
    ),
    "break in finally": (
        "for _ in [0]:\n    try:\n        assert f(1) == 2\n    finally:\n        break\n",
        zero,
        inc,
    ),
    "raise AssertionError swallowed": (
        "try:\n    if f(1) != 2:\n        raise AssertionError('wrong')\nexcept AssertionError:\n    pass\n",
        zero,
        inc,
    ),
    "assertRaises around an assertion": (
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
        "        with self.assertRaises(Exception):\n            self.assertEqual(f(1), 2)\n",
        zero,
        None,  # the tests demand an exception from a correct answer: nothing honest passes
    ),
    # rule 3: a site that started and did not hold, whatever happened to the failure
    "a failure in a thread": (
        "import threading\ndef run():\n    assert f(1) == 2\ndef test_threaded():\n"
        "    t = threading.Thread(target=run)\n    t.start()\n    t.join()\n    assert True\n",
        zero,
        inc,
    ),
    "a failure swallowed in recursion": (
        "def check_all(xs):\n    if not xs:\n        return\n    try:\n        assert f(xs[0]) == xs[0] + 1\n"
        "        check_all(xs[1:])\n    except AssertionError:\n        if len(xs) > 1:\n            raise\n"
        "check_all([1, 2])\n",
        lambda x: 2,
        inc,
    ),
    # rule 4: one of the unit's own sites did not run
    "an assert under an if": ("r = f(1)\nif r is not None:\n    assert r == 2\n", lambda x: None, inc),
    "a loop over a returned empty list": (
        "for x in f(3):\n    assert x > 0\n",
        lambda n: [],
        lambda n: [1, 2, 3],
    ),
    "a version guard": (
        "import sys\nif sys.version_info >= (3, 99):\n    assert f(1) == 2\nassert f(0) is not None\n",
        zero,
        None,
    ),
    "an early return in check": (
        "def check(c):\n    if c(0) == 'skip':\n        return\n    assert c(1) == 2\n",
        lambda x: "skip",
        inc,
    ),
    "an async test method in a plain TestCase": (
        "import unittest\nclass T(unittest.TestCase):\n    async def test_a(self):\n        self.assertEqual(f(1), 2)\n",
        zero,
        None,  # unittest never awaits it, for anyone
    ),
    # rule 5: nothing asserted at all
    "a loop calling an asserting helper over nothing": (
        "def one(x):\n    assert x > 0\nfor x in f(3):\n    one(x)\n",
        lambda n: [],
        lambda n: [1, 2, 3],
    ),
    # rule 6: a helper the unit reaches, which never ran anywhere
    "an asserting helper referenced but never called": (
        "def verify():\n    assert f(1) == 2\nassert verify\n",
        zero,
        None,
    ),
    "an unconsumed map of an asserting helper": (
        "def one(x):\n    assert f(x) == x + 1\nassert map(one, [1, 2])\n",
        zero,
        None,
    ),
}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread case
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")  # unittest never awaits it
@pytest.mark.filterwarnings("ignore:It is deprecated to return a value")
@pytest.mark.parametrize("name", list(FOOLED))
def test_each_rule_fails_the_shape_that_fooled_the_planner_and_honest_code_still_passes(name):
    src, wrong, honest = FOOLED[name]
    outcome = _run(src, wrong)
    assert outcome.passed < outcome.total, (name, outcome)
    if honest is not None:
        good = _run(src, honest)
        assert good.passed == good.total, (name, good)


def test_a_test_that_expects_an_exception_needs_no_site_to_run():
    """Tripwires (assert False, self.fail, raise AssertionError) run only when something is wrong."""

    def raises(x):
        if x < 0:
            raise ValueError
        return x

    for src in (
        "try:\n    f(-1)\n    assert False\nexcept ValueError:\n    pass\n",
        "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        try:\n            f(-1)\n"
        "        except ValueError:\n            pass\n        else:\n            self.fail('no error')\n",
    ):
        assert (_run(src, raises).passed, _run(src, abs).passed) == (1, 0)


def test_a_guard_holds_when_its_condition_is_false_and_must_run():
    src = "for x in f(2):\n    if x != 1:\n        raise AssertionError(x)\n"
    assert _run(src, lambda n: [1, 1]).passed == 1
    assert _run(src, lambda n: [1, 5]).passed == 0
    assert _run(src, lambda n: []).passed == 0  # the guard never ran


def test_a_split_check_keeps_its_locals_and_a_failing_unit_does_not_stop_the_next():
    """Issue class B: on main the split body ran at module level, and its locals leaked."""
    src = (
        "expected = [2, 3]\ndef check(candidate):\n    expected = [candidate(1), candidate(2)]\n"
        "    assert len(expected) == 2\n    assert candidate(5) == 6\ndef test_values():\n    assert [f(1), f(2)] == expected\n"
    )
    outcome = _run(src, zero)
    assert (outcome.passed, outcome.total) == (1, 3)  # only the length check holds
    assert _run(src, inc).passed == 3


def test_a_timeout_inside_a_split_check_ends_it_without_failing_the_units_before():
    def slow(x):
        if x == 2:
            raise testrunner.JobTimeout("time is up")
        return x + 1

    src = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n    assert candidate(3) == 4\n"
    outcome = _run(src, slow)
    assert (outcome.passed, outcome.total) == (1, 3)
    assert any("did not run" in f for f in outcome.failures)


def test_tracing_is_off_outside_the_run_and_the_previous_tracer_is_restored():
    seen = []

    def outer_tracer(frame, event, arg):
        seen.append(event)
        return None

    previous = sys.gettrace()
    sys.settrace(outer_tracer)
    try:
        _run("assert f(1) == 2\n", inc)
        assert sys.gettrace() is outer_tracer
    finally:
        sys.settrace(previous)


def test_names_from_the_problems_code_are_the_problems_not_the_solutions():
    """Issue class A: a helper of HumanEval's prompt is bound from the prompt, so a solution that
    redefines it changes nothing for the tests."""
    prefix = "def encode(s):\n    return s[::-1]\ndef f(s):\n    '''decode'''\n"
    src = "def check(candidate):\n    for s in ['ab', 'xyz']:\n        assert candidate(encode(s)) == s\n"
    assert _run(src, lambda s: s[::-1], prefix).passed == 1
    assert _run(src, lambda s: s, prefix).passed == 0  # with its own `encode = identity` it would pass
