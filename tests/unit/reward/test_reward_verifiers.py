"""In-process verifiers and the function-kind pool that runs them."""

import threading

import pytest

from megatron_rl.config.schema import RewardConfig
from megatron_rl.reward import verifiers
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.result import RewardResult


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("so the total is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("first \\boxed{3} then \\boxed{x^{2}}", "x^{2}"),
        ("The answer is 42.", "42"),
        ("<think>maybe 7</think> we get 1,234 apples", "1,234"),
        ("no numbers here", None),
    ],
)
def test_final_answer(completion, expected):
    assert verifiers.final_answer(completion) == expected


@pytest.mark.parametrize(
    ("predicted", "expected", "match"),
    [
        ("\\frac{1}{2}", "0.5", True),
        ("1/3", "2/6", True),
        ("0.3333333", "1/3", True),
        ("1,000", "1000", True),
        ("$12$.", "12", True),
        ("\\text{Paris}", "paris", True),
        ("3", "4", False),
        ("x+1", "x+2", False),
    ],
)
def test_answers_match(predicted, expected, match):
    assert verifiers.answers_match(predicted, expected) is match


def test_python_format_needs_the_entry_point_defined():
    p = Problem(id="p", prompt="q", tests="assert f(1) == 1\n", entry_point="f")
    assert verifiers.python_format(p, "```python\ndef f(x):\n    return x\n```") == 1.0
    assert verifiers.python_format(p, "```python\ndef g(x):\n    return x\n```") == 0.0
    assert verifiers.python_format(p, "I don't know") == 0.0


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("nocolon", ValueError, "module:function"),
        ("no_such_module_xyz:f", ImportError, "no_such_module_xyz"),
        ("megatron_rl.reward.verifiers:nope", AttributeError, "nope"),
        ("megatron_rl.reward.verifiers:re", TypeError, "not a function"),
    ],
)
def test_load_verifier_errors_say_what_is_wrong(spec, error, match):
    with pytest.raises(error, match=match):
        verifiers.load_verifier(spec)


def _cfg(function: str) -> RewardConfig:
    return RewardConfig(kind="function", function=function, workers=3)


def test_function_pool_streams_results_from_many_submitting_threads():
    problems = [Problem(id=f"m{i}", prompt="?", answer=str(i)) for i in range(40)]
    with RewardPool(_cfg("megatron_rl.reward.verifiers:math_answer")) as pool:

        def feed(part: int) -> None:
            for i in range(part, 40, 4):
                pool.submit(i, problems[i], f"\\boxed{{{i if i % 2 else i + 1}}}")

        threads = [threading.Thread(target=feed, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = {r.sample_id: r for r in pool.results(40, timeout=30)}
    assert sorted(results) == list(range(40))
    assert all(results[i].reward == (1.0 if i % 2 else 0.0) for i in range(40))
    assert all(results[i].status == ("passed" if i % 2 else "failed") for i in range(40))


def raising_verifier(problem, completion):
    raise RuntimeError("verifier bug")


def bad_return_verifier(problem, completion):
    return "yes"


def record_verifier(problem, completion):
    return RewardResult(sample_id=None, reward=0.5, status="failed", tests_passed=1, tests_total=2)


@pytest.mark.parametrize(
    ("name", "status", "reward", "tail"),
    [
        ("raising_verifier", "crashed", 0.0, "verifier bug"),
        ("bad_return_verifier", "crashed", 0.0, "'yes'"),
        ("record_verifier", "failed", 0.5, ""),
    ],
)
def test_function_pool_turns_any_outcome_into_a_record(name, status, reward, tail):
    with RewardPool(_cfg(f"{__name__}:{name}")) as pool:
        (result,) = pool.score([Problem(id="p", prompt="?", answer="1")], ["1"])
    assert (result.status, result.reward, result.sample_id) == (status, reward, 0)
    assert tail in result.output_tail
