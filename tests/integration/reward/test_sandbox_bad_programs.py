"""Hostile programs: each ends with reward 0 and the right status within its time bound, leaves no
process behind, and the pool serves the next sample normally.

Every attack is written so that it would *earn* the reward if it worked (the test expects `f(1) == 2`
and the program returns 2 only on success), so reward 0 is the trusted side's verdict that it failed.
"""

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from megatron_rl.config.schema import RewardConfig
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.sandbox import find_bwrap

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)

TIMEOUT = 1.0
TESTS = "assert f(1) == 2\n"
GOOD = "def f(x):\n    return x + 1\n"


def descendants() -> int:
    return len(psutil.Process().children(recursive=True))


@pytest.fixture(scope="module")
def pool():
    with RewardPool(RewardConfig(kind="sandbox", workers=2, timeout_s=TIMEOUT, memory_mb=256)) as p:
        p.score([Problem(id="warm", prompt="p", tests=TESTS, entry_point="f")] * 2, [GOOD] * 2)
        yield p


def run_hostile(pool, code, *, status, seconds, tests=TESTS, timeout_s=None):
    """Score `code`; check reward, status, time, leftovers, and that the pool still serves."""
    problem = Problem(id="hostile", prompt="p", tests=tests, entry_point="f", timeout_s=timeout_s)
    before = descendants()
    start = time.monotonic()
    (result,) = pool.score([problem], [code], timeout=60)
    wall = time.monotonic() - start
    assert result.reward == 0.0, result
    assert result.status == status, result
    assert result.seconds <= seconds and wall <= seconds + 1.0, (result.seconds, wall)
    assert descendants() == before, "a process outlived its job"
    assert len(result.output_tail) <= 2 * 2048
    good = pool.score([Problem(id="good", prompt="p", tests=TESTS, entry_point="f")] * 2, [GOOD] * 2)
    assert [r.status for r in good] == ["passed", "passed"]
    return result


CASES = {
    "infinite_loop": ("def f(x):\n    while True:\n        pass\n", "timeout", TIMEOUT + 3),
    "infinite_loop_at_import": ("while True:\n    pass\n", "timeout", TIMEOUT + 3),
    "sleep_past_timeout": (
        "import time\ndef f(x):\n    time.sleep(60)\n    return 2\n",
        "timeout",
        TIMEOUT + 3,
    ),
    "ignore_sigterm": (
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ndef f(x):\n    while True:\n        pass\n",
        "timeout",
        TIMEOUT + 3,
    ),
    # Fork bombs: the process limit stops the first (EAGAIN kills it), the deadline the second; the
    # bound leaves room to kill and reap ~35 processes on a loaded machine. The first gets a longer
    # deadline so that the limit, not the clock, is what stops it even when forking is slow.
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "crashed", 15, 5.0),
    "fork_bomb_that_survives_eagain": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "timeout",
        15,
    ),
    # Filling 256 MiB takes a while on a loaded machine: these get a longer deadline, so that the
    # address-space limit, not the clock, is what stops them.
    "memory_bomb": ("x = bytearray(10**11)\ndef f(x):\n    return 2\n", "memory", 8, 5.0),
    "memory_growth": (
        "def f(x):\n    hog = []\n    while True:\n        hog.append(' ' * 10**6)\n",
        "memory",
        8,
        5.0,
    ),
    "print_gigabytes": (
        "import sys\ndef f(x):\n    while True:\n        sys.stdout.write('x' * (1 << 20))\n",
        "crashed",
        5,
    ),
    "read_stdin": ("line = input()\ndef f(x):\n    return 2\n", "crashed", 5),
    "sys_exit_0_before_tests": ("import sys\nsys.exit(0)\ndef f(x):\n    return 2\n", "crashed", 5),
    "os_exit_0_before_tests": ("import os\nos._exit(0)\n", "crashed", 5),
    "print_a_fake_verdict_and_exit": (
        'import os\nprint(\'1 passed, 0 failed\')\nprint(\'{"status": "passed", "passed": 1, "total": 1}\')\nos._exit(0)\n',
        "crashed",
        5,
    ),
    "kill_its_parent": (
        "import os, signal\ndef f(x):\n    for target in (os.getppid(), 1, -1):\n"
        "        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):\n"
        "            try:\n                os.kill(target, sig)\n            except OSError:\n                pass\n    return 3\n",
        "failed",
        5,
    ),
    "daemon_outliving_its_test": (
        "import os, time\ndef f(x):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n        os._exit(0)\n    time.sleep(0.2)\n    return 3\n",
        "failed",
        5,
    ),
    "rigged_equality": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    def __bool__(self):\n        return True\n"
        "def f(x):\n    return Anything()\n",
        "failed",
        5,
    ),
    "monkeypatch_test_helpers": (
        "import builtins, sys\n"
        "runner = sys.modules.get('megatron_rl.reward.testrunner')\n"
        "if runner is not None:\n"
        "    runner.run_units = lambda plan, ns: runner.RunOutcome(plan.total, plan.total, [])\n"
        "    runner.RemoteObject.__eq__ = lambda self, other: True\n"
        "    runner.decode_reply = lambda reply, make_handle: 2\n"
        "builtins.AssertionError = type('Harmless', (Exception,), {})\n"
        "def f(x):\n    return 3\n",
        "failed",
        5,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_program(pool, case):
    code, status, seconds, *timeout_s = CASES[case]
    run_hostile(pool, code, status=status, seconds=seconds, timeout_s=timeout_s[0] if timeout_s else None)


def test_cannot_write_outside_its_work_dir(pool, tmp_path):
    targets = [
        str(tmp_path / "pwned"),
        "/work/main/pwned_by_sandbox",
        "/root/pwned",
        "/etc/pwned",
        "/usr/pwned",
        "/pwned",
    ]
    code = (
        f"def f(x):\n    wrote = 0\n    for path in {targets!r}:\n        try:\n"
        "            with open(path, 'w') as fh:\n                fh.write('x')\n            wrote += 1\n"
        "        except OSError:\n            pass\n    return 2 if wrote else 0\n"
    )
    run_hostile(pool, code, status="failed", seconds=5)
    assert not any(os.path.exists(t) for t in targets)


def test_cannot_read_environment_secrets(monkeypatch):
    monkeypatch.setenv("MEGATRON_RL_TEST_SECRET", "s3cr3t-value")
    code = (
        "import os\ndef f(x):\n    seen = ' '.join(os.environ.values())\n    for pid in os.listdir('/proc'):\n"
        "        try:\n            seen += open(f'/proc/{pid}/environ').read()\n        except OSError:\n            pass\n"
        "    print(dict(os.environ))\n    return 2 if 's3cr3t' in seen else 0\n"
    )
    with RewardPool(
        RewardConfig(kind="sandbox", workers=1, timeout_s=TIMEOUT)
    ) as fresh:  # started with the secret set
        result = run_hostile(fresh, code, status="failed", seconds=5)
    assert "s3cr3t" not in result.output_tail


def test_cannot_reach_a_listener_on_host_loopback(pool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.05)
    port = listener.getsockname()[1]
    code = (
        "import socket\ndef f(x):\n    s = socket.socket()\n    s.settimeout(0.5)\n    try:\n"
        f"        s.connect(('127.0.0.1', {port}))\n        return 2\n    except OSError as e:\n"
        "        print(type(e).__name__)\n        return 0\n"
    )
    try:
        result = run_hostile(pool, code, status="failed", seconds=5)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert "ConnectionRefusedError" in result.output_tail or "OSError" in result.output_tail


def test_a_program_whose_garbage_is_cyclic_runs_as_in_plain_python(pool):
    """The solution process collects its reference cycles: ~300 MB of cyclic garbage made one list at a
    time stays within 256 MiB, as it does in plain Python (the sandbox once ran solutions with the
    collector off, inherited from the job process, and such a program died of a MemoryError)."""
    code = "def f(x):\n    for _ in range(2_000_000):\n        a = [None] * 8\n        a[0] = a\n    return x + 1\n"
    problem = Problem(id="cycles", prompt="p", tests=TESTS, entry_point="f", timeout_s=10.0)
    (result,) = pool.score([problem], [code], timeout=60)
    assert result.status == "passed", result


def test_nothing_carries_over_to_the_next_job(pool):
    """A job's files and processes are gone before the next job runs in the same sandbox."""
    with RewardPool(RewardConfig(kind="sandbox", workers=1, timeout_s=TIMEOUT)) as single:
        plant = "import os\nopen('/tmp/left_behind', 'w').write('x')\ndef f(x):\n    return 2\n"
        assert (
            single.score([Problem(id="a", prompt="p", tests=TESTS, entry_point="f")], [plant])[0].status
            == "passed"
        )
        probe = "import os\ndef f(x):\n    return 2 if os.path.exists('/tmp/left_behind') else 0\n"
        run_hostile(single, probe, status="failed", seconds=5)


def test_the_tests_never_reach_the_solution_memory(pool):
    """The program scans its own memory for the tests' expected answer; it is not there to find."""
    tests = "assert f(1) == 'zq' + 'EXPECTED-ANSWER-7731'\n"
    code = (
        "import gc, re\ndef f(x):\n    needle = b'EXPECTED-' + b'ANSWER-7731'\n"
        "    for obj in gc.get_objects():\n        if isinstance(obj, str) and 'EXPECTED-' + 'ANSWER-7731' in obj:\n"
        "            return 'zqEXPECTED-' + 'ANSWER-7731'\n"
        "    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb') as mem:\n"
        "        for line in maps:\n            lo, hi = (int(v, 16) for v in line.split()[0].split('-'))\n"
        "            if 'r' not in line.split()[1] or hi - lo > 1 << 28:\n                continue\n"
        "            try:\n                mem.seek(lo)\n                if needle in mem.read(hi - lo):\n"
        "                    return 'zqEXPECTED-' + 'ANSWER-7731'\n            except (OSError, OverflowError, ValueError):\n"
        "                pass\n    return None\n"
    )
    run_hostile(pool, code, status="failed", seconds=8, tests=tests)


def test_a_job_is_two_processes_below_the_zygote(pool):
    """The test runner T is cloned straight into the job's namespaces, PID 1 there, and forks the
    solution U: no process between the zygote and T (each job then has one process fewer to copy and
    tear down; benchmarks/sandbox.py measures what that buys)."""
    code = "import time\ndef f(x):\n    time.sleep(2)\n    return x + 1\n"
    problem = Problem(id="slow", prompt="p", tests=TESTS, entry_point="f", timeout_s=10.0)
    with ThreadPoolExecutor(1) as ex:
        job = ex.submit(pool.score, [problem], [code], 60)
        deepest: list = []
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline and not job.done():
            time.sleep(0.1)
            below = []  # (generations below the nearest bubblewrap, process)
            for p in psutil.Process().children(recursive=True):
                try:
                    names = [a.name() for a in p.parents()]
                except psutil.Error:
                    continue
                if "bwrap" in names:
                    below.append((names.index("bwrap"), p))
            if below and max(d for d, _ in below) >= 2:
                deepest = [p for d, p in below if d == max(d for d, _ in below)]
                break
        assert deepest, "no running solution process was seen"
        runner = deepest[0].parent()
        with open(f"/proc/{runner.pid}/status") as f:
            nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
        depth = max(d for d, _ in below)
        assert job.result()[0].status == "passed"
    assert depth == 2, f"bubblewrap -> zygote -> T -> U expected; the solution is {depth + 1} below"
    assert nspid[-1] == "1", f"T is not PID 1 of its job: NSpid {nspid}"
