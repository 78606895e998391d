"""Correct programs pass, wrong ones fail, partial credit follows the mode, and the pool streams."""

import threading
import time

import pytest

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import load_problems
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, find_bwrap

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)

FOUR = Problem(
    id="inc",
    prompt="p",
    tests="assert f(1) == 2\nassert f(2) == 3\nassert f(3) == 4\nassert f(-1) == 0\n",
    entry_point="f",
)
THREE_OF_FOUR = "def f(x):\n    return x + 1 if x > 0 else 7\n"


def _pool(**overrides) -> RewardPool:
    return RewardPool(RewardConfig(**{"kind": "sandbox", "workers": 2, "timeout_s": 2.0, **overrides}))


@pytest.fixture(scope="module")
def pool():
    with _pool(timeout_s=10.0) as p:  # the bundled problems' default; short-deadline tests set their own
        yield p


def test_every_bundled_reference_solution_passes_and_a_stub_does_not(pool):
    problems = load_problems("bundled")
    fenced = [f"Here you go:\n```python\n{p.metadata['solution']}```\n" for p in problems]
    results = pool.score(problems, fenced, timeout=300)
    failures = {
        p.id: (r.status, r.output_tail[-300:]) for p, r in zip(problems, results) if r.status != "passed"
    }
    assert not failures
    assert all(r.reward == 1.0 and r.tests_passed == r.tests_total > 0 for r in results)
    stubs = [f"def {p.entry_point}(*args, **kwargs):\n    raise NotImplementedError\n" for p in problems]
    assert all(r.reward == 0.0 and r.status == "failed" for r in pool.score(problems, stubs, timeout=300))


def test_partial_credit_follows_the_mode(pool):
    (strict,) = pool.score([FOUR], [THREE_OF_FOUR])
    assert (strict.status, strict.reward, strict.tests_passed, strict.tests_total) == ("failed", 0.0, 3, 4)
    assert "test 4 failed: assert f(-1) == 0" in strict.output_tail
    with _pool(mode="fraction", workers=1) as fraction:
        (partial,) = fraction.score([FOUR], [THREE_OF_FOUR])
        assert (partial.status, partial.reward) == ("failed", 0.75)
        hangs_late = "def f(x):\n    while x < 0:\n        pass\n    return x + 1\n"
        (late,) = fraction.score([FOUR], [hangs_late])
        assert (late.status, late.reward) == ("timeout", 0.75)


@pytest.mark.parametrize(
    ("completion", "status"),
    [
        ("I am not sure how to do this.", "no_code"),
        ("```python\ndef f(x)\n    return x\n```", "syntax_error"),
        ("```python\ndef f(x):\n    return x + 1\n```", "passed"),
        ("def f(x):\n    raise ValueError('no')\n", "failed"),
        ("import does_not_exist\ndef f(x):\n    return x + 1\n", "crashed"),
    ],
)
def test_statuses(pool, completion, status):
    (result,) = pool.score([FOUR], [completion])
    assert result.status == status, result
    assert result.reward == (1.0 if status == "passed" else 0.0)


def test_expected_exceptions_classes_and_check_shape(pool):
    problems = [
        Problem(
            id="raises",
            prompt="p",
            entry_point="f",
            tests="try:\n    f(0)\n    assert False\nexcept ZeroDivisionError:\n    pass\n",
        ),
        Problem(
            id="cls",
            prompt="p",
            entry_point="Box",
            tests="b = Box(3)\nassert b.get() == 3\nassert b.size == 1\nassert [b.get() for _ in range(2)] == [3, 3]\n",
        ),
        Problem(
            id="check",
            prompt="p",
            entry_point="f",
            tests="def check(candidate):\n    assert candidate(2) == 0.5\n    assert candidate(4) == 0.25\n",
        ),
    ]
    code = "class Box:\n    size = 1\n    def __init__(self, v):\n        self.v = v\n    def get(self):\n        return self.v\ndef f(x):\n    return 1 / x\n"
    assert [r.status for r in pool.score(problems, [code] * 3)] == ["passed"] * 3


def test_problem_timeout_overrides_the_config(pool):
    slow = Problem(id="slow", prompt="p", tests="assert f(1) == 2\n", entry_point="f", timeout_s=0.3)
    (result,) = pool.score([slow], ["import time\ndef f(x):\n    time.sleep(5)\n"])
    assert result.status == "timeout" and result.seconds < 3.0


def test_results_stream_while_samples_are_still_being_submitted(pool):
    """The first results arrive before the last sample is submitted (generation is still running)."""
    submitted_all = threading.Event()
    early: list[bool] = []

    def generate():
        for i in range(8):
            pool.submit(i, FOUR, "def f(x):\n    return x + 1\n")
            time.sleep(0.1)
        submitted_all.set()

    producer = threading.Thread(target=generate)
    producer.start()
    time.sleep(0.05)
    seen = []
    for result in pool.results(8, timeout=60):
        early.append(not submitted_all.is_set())
        seen.append(result.sample_id)
    producer.join()
    assert sorted(seen) == list(range(8)) and early[0]
    assert pool.pending == 0


def test_sandbox_death_costs_one_sample_and_it_restarts():
    with Sandbox(SandboxLimits(timeout_s=5), bwrap=find_bwrap()) as sb:
        sb.start()
        out = {}
        job = threading.Thread(
            target=lambda: out.update(
                sb.run("import time\ndef f(x):\n    time.sleep(10)\n", "assert f(1)\n", "f")
            )
        )
        job.start()
        time.sleep(0.5)
        import os
        import signal

        os.kill(sb.pid, signal.SIGKILL)
        job.join(timeout=20)
        assert out["status"] == "sandbox_error"
        assert sb.run("def f(x):\n    return 2\n", "assert f(1) == 2\n", "f")["status"] == "passed"
        assert sb.starts == 2


def test_refuses_to_run_without_bubblewrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="unsafe_local"):
        _pool()


def test_unsafe_local_mode_warns_loudly_and_still_scores(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        unsafe = _pool(unsafe_local=True, workers=1)
    not_root = "import os\ndef f(x):\n    return x + 1 if os.getuid() != 0 else 0\n"  # root would reach every process
    with unsafe:
        results = unsafe.score(
            [FOUR] * 3, ["def f(x):\n    return x + 1\n", "import sys\nsys.exit(0)\n", not_root]
        )
    assert [r.status for r in results] == ["passed", "crashed", "passed"]
    assert "UNSAFE" in capsys.readouterr().err


def test_top_level_values_are_tested_as_plain_data(pool):
    """The shape of the tiny recipe's task: the program binds `ans`, the tests read it."""
    target = 12
    problem = Problem(
        id="expr",
        prompt="12=",
        tests=f"assert isinstance(ans, int)\nassert abs(ans - {target}) <= 4\nassert abs(ans - {target}) <= 1\nassert ans == {target}\n",
    )
    rigged = "class Anything(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\nans = Anything(99)\n"
    results = pool.score([problem] * 4, ["ans = 3*4", "ans = 2*5+1", rigged, "ans = 1+*2"])
    assert [(r.status, r.tests_passed) for r in results] == [
        ("passed", 4),
        ("failed", 3),
        ("failed", 1),
        ("syntax_error", 0),
    ]
