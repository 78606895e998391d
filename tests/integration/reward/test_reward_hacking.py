"""Every case of `hacking_cases.py` and `hacking_cases_round2.py`: refused at load, or scored with
reward 0 in a real sandbox.

Honest completions under the same tests still earn reward 1, no process outlives its job, and the
pool serves normally after every case.
"""

import json

import psutil
import pytest
from hacking_cases import CASES as ROUND1
from hacking_cases import Case
from hacking_cases_round2 import CASES as ROUND2

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.problems import load_problems
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.sandbox import find_bwrap

CASES = ROUND1 + ROUND2
SCORED = [c for c in CASES if c.expect == "zero"]
REFUSED = [c for c in CASES if c.expect == "refused"]
GOOD = Problem(id="good", prompt="p", tests="assert f(1) == 2\n", entry_point="f")
needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)


def _record(case: Case) -> dict:
    return {
        "id": case.name,
        "prompt": "p",
        "tests": case.tests,
        "entry_point": case.entry_point,
        "prefix": case.prefix,
    }


def test_the_suite_is_large_and_well_formed():
    assert len({c.name for c in CASES}) == len(CASES)
    assert all(c.expect in ("zero", "refused") for c in CASES)
    assert len(CASES) >= 11 + 15 + 5 + 25  # both rounds of the issues' holes, and more
    for kind in "ABCDEFG":  # issue 29's classes, several variants of each
        assert sum(c.name.startswith(f"{kind}_") for c in CASES) >= 3, kind


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_unjudgeable_tests_are_refused_at_load_with_file_line_and_reason(tmp_path, case):
    path = tmp_path / "problems.jsonl"
    good = {"id": "fine", "prompt": "p", "tests": "assert f(1) == 2\n", "entry_point": "f"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(_record(case)) + "\n")
    with pytest.raises(ValueError) as info:
        load_problems(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: problem {case.name!r}: tests line "), message
    assert case.match in message


@pytest.fixture(scope="module")
def pool():
    cfg = RewardConfig(kind="sandbox", workers=2, timeout_s=2.0, memory_mb=128)
    with RewardPool(cfg) as p:
        p.score([GOOD] * 2, ["def f(x):\n    return x + 1\n"] * 2)
        yield p


def _processes() -> int:
    return len(psutil.Process().children(recursive=True))


@needs_bwrap
@pytest.mark.parametrize("case", SCORED, ids=lambda c: c.name)
def test_wrong_code_earns_nothing_and_honest_code_still_passes(pool, case):
    problem = Problem(
        id=case.name,
        prompt="p",
        tests=case.tests,
        entry_point=case.entry_point,
        timeout_s=case.timeout_s,
        prefix=case.prefix,
    )
    before = _processes()
    if case.plant is not None:  # an earlier job in the same sandbox: one worker, so it is the same one
        with RewardPool(RewardConfig(kind="sandbox", workers=1, timeout_s=2.0, memory_mb=128)) as single:
            (planted,) = single.score([problem], [case.plant], timeout=60)
            assert planted.status == "passed", planted
            (result,) = single.score([problem], [case.code], timeout=60)
    else:
        (result,) = pool.score([problem], [case.code], timeout=60)
    assert result.reward == 0.0, result
    assert result.tests_passed < result.tests_total, result
    if case.status is not None:
        assert result.status == case.status, result
    if case.honest is not None:
        (honest,) = pool.score([problem], [case.honest], timeout=60)
        assert (honest.status, honest.reward) == ("passed", 1.0), honest
    assert _processes() == before, "a process outlived its job"
    after = pool.score([GOOD] * 2, ["def f(x):\n    return x + 1\n"] * 2, timeout=60)
    assert [r.status for r in after] == ["passed", "passed"]


@needs_bwrap
def test_signals_are_named_and_do_not_restart_the_sandbox():
    with RewardPool(RewardConfig(kind="sandbox", workers=1, timeout_s=2.0)) as single:
        code = "import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGRTMIN + 2)\n"
        (result,) = single.score([GOOD], [code])
        assert result.status == "crashed" and "SIGRTMIN+2" in result.output_tail, result
        group = "import os, signal\ndef f(x):\n    os.kill(0, signal.SIGTERM)\n"
        (result,) = single.score([GOOD], [group])
        assert result.status == "crashed" and "SIGTERM" in result.output_tail, result
        assert single._sandboxes[0].starts == 1  # the completion's crash, not the sandbox's


@needs_bwrap
def test_memory_limit_counts_every_process_of_the_job():
    """Children each under the address-space limit, together over the job's memory cgroup."""
    with RewardPool(RewardConfig(kind="sandbox", workers=1, timeout_s=8.0, memory_mb=96)) as single:
        sandbox = single._sandboxes[0]
        if sandbox._cgroup is None:
            pytest.skip("no writable memory cgroup on this host")
        code = (  # six children of 60 MiB at once; the answer is right only if all survive
            "import os, time\npids = []\nfor _ in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
            "        b = bytearray(60 << 20)\n        b[::4096] = b'\\1' * len(b[::4096])\n        time.sleep(2)\n"
            "        os._exit(0)\n"
            "    pids.append(pid)\nok = all(os.waitpid(p, 0)[1] == 0 for p in pids)\n"
            "def f(x):\n    return x + 1 if ok else 0\n"
        )
        (result,) = single.score([GOOD], [code], timeout=60)
        assert (result.status, result.reward) == ("memory", 0.0), result
        assert single.score([GOOD], ["def f(x):\n    return x + 1\n"])[0].status == "passed"
