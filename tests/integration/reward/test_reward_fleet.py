"""The reward fleet: real `megatron-rl reward-server` processes on loopback, scored through the pool's
dispatch (reward/remote.py), and an HTTP judge (reward.kind=http) against a small real server.

The servers run the fixed-latency function verifier (fast to start, the work a slow verifier does);
one test serves the bubblewrap sandbox itself."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from megatron_rl.config.schema import RewardConfig
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.sandbox import find_bwrap
from megatron_rl.reward.server import TOKEN_ENV
from tests.helpers.fleet import REPO, TOKEN, start_server, stop
from tests.helpers.launch import free_port

LATENCY = "megatron_rl.reward.verifiers:fixed_latency"


def math_problem(i: int) -> Problem:
    return Problem(id=f"m{i}", prompt=f"{i}+1?", answer=str(i + 1))


def answer(i: int) -> str:
    return f"\\boxed{{{i + 1 if i % 3 else i}}}"  # every third one wrong


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    a = start_server(tmp, "a", "--function", LATENCY, "--workers", "2", "--queue", "4")
    b = start_server(tmp, "b", "--function", LATENCY, "--workers", "2", "--queue", "4")
    yield [a, b]
    stop(a[0], b[0])


def fleet_config(endpoints, **kw) -> RewardConfig:
    return RewardConfig(kind="function", function=LATENCY, endpoints=list(endpoints), **kw)


def test_health_needs_no_token_and_score_needs_the_jobs(servers):
    (_, address), _ = servers
    h = requests.get(f"http://{address}/health", timeout=10).json()
    assert h["status"] == "ok" and h["kind"] == "function" and h["capacity"] == 4 and h["workers"] == 2
    body = {"id": 1, "problem": {"id": "p", "prompt": "1+1?", "answer": "2"}, "completion": "\\boxed{2}"}
    r = requests.post(f"http://{address}/score", json=body, timeout=10)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    r = requests.post(
        f"http://{address}/score", json=body, headers={"Authorization": "Bearer x" * 3}, timeout=10
    )
    assert r.status_code == 403
    ok = {"Authorization": f"Bearer {TOKEN}"}
    r = requests.post(f"http://{address}/score", json=body, headers=ok, timeout=10)
    assert r.status_code == 200 and r.json()["reward"] == 1.0 and r.json()["status"] == "passed", r.text
    bad = {**body, "problem": {"id": "p", "prompt": "", "answer": "2"}}
    r = requests.post(f"http://{address}/score", json=bad, headers=ok, timeout=10)
    assert r.status_code == 400 and "prompt" in r.json()["error"]
    r = requests.post(f"http://{address}/score", data=b"{not json", headers=ok, timeout=10)
    assert r.status_code == 400
    for problem in ({"id": 7, "prompt": "p"}, {"id": "p", "prompt": "p", "timeout_s": "soon"}, [], {"x": 1}):
        r = requests.post(
            f"http://{address}/score", json={**body, "problem": problem}, headers=ok, timeout=10
        )
        assert r.status_code == 400, (
            problem,
            r.status_code,
            r.text,
        )  # never a 500: the client would back off
    r = requests.post(f"http://{address}/score", json={**body, "completion": 3}, headers=ok, timeout=10)
    assert r.status_code == 400 and "completion" in r.json()["error"]


def test_a_full_queue_answers_503(tmp_path):
    proc, address = start_server(
        tmp_path, "q", "--function", LATENCY, "--workers", "1", "--queue", "1", latency_s=1.0
    )
    try:
        body = {"id": 1, "problem": {"id": "p", "prompt": "1+1?", "answer": "2"}, "completion": "\\boxed{2}"}
        ok = {"Authorization": f"Bearer {TOKEN}"}
        first = threading.Thread(
            target=requests.post, args=(f"http://{address}/score",), kwargs={"json": body, "headers": ok}
        )
        first.start()
        time.sleep(0.3)  # the first job holds the only slot for a second
        r = requests.post(f"http://{address}/score", json=body, headers=ok, timeout=10)
        first.join()
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    finally:
        stop(proc)


def test_the_server_refuses_to_start_without_a_real_token(tmp_path):
    for token, message in (("", "needs a token"), ("short", "at least 16")):
        env = {**os.environ, TOKEN_ENV: token}
        done = subprocess.run(
            [sys.executable, "-m", "megatron_rl.cli", "reward-server", "--port", "0", "--function", LATENCY],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_samples_spread_over_the_servers_and_a_killed_one_loses_none(tmp_path, monkeypatch):
    """Two servers; one is killed with SIGKILL while samples are in flight: every sample is scored
    exactly once with its right reward, the retries are counted, and the survivor did the rest."""
    a, b = (
        start_server(tmp_path, n, "--function", LATENCY, "--workers", "2", "--queue", "4", latency_s=0.1)
        for n in "ab"
    )
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    try:
        n = 40
        with RewardPool(fleet_config([a[1], b[1]], remote_timeout_s=10)) as pool:
            assert pool.workers == 8  # every slot of both servers
            for i in range(n):
                pool.submit(i, math_problem(i), answer(i))
            got = []
            for r in pool.results(n, timeout=120):
                got.append(r)
                if len(got) == 6:
                    os.kill(a[0].pid, signal.SIGKILL)
            retries = pool.take_retries()
        assert sorted(r.sample_id for r in got) == list(range(n))
        wrong = [r for r in got if r.reward != (1.0 if r.sample_id % 3 else 0.0)]
        assert not wrong, wrong[:3]
        assert all(r.status in ("passed", "failed") for r in got)
        assert retries >= 1  # the killed server's jobs in flight were sent again
        scored_b = requests.get(f"http://{b[1]}/health", timeout=10).json()["scored"]
        assert scored_b >= n // 2
    finally:
        stop(a[0], b[0])


def test_a_wrong_token_or_other_reward_settings_fail_loudly(servers, monkeypatch):
    (_, address), _ = servers
    monkeypatch.setenv(TOKEN_ENV, "another-jobs-token-0123456789")
    with RewardPool(fleet_config([address])) as pool:
        pool.submit(0, math_problem(0), answer(1))
        with pytest.raises(RuntimeError, match="refused the job's token"):
            list(pool.results(1, timeout=60))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with pytest.raises(ValueError, match="mode='all_or_nothing', the recipe with reward.mode='fraction'"):
        RewardPool(fleet_config([address], mode="fraction"))
    with pytest.raises(ValueError, match="not host:port"):
        RewardPool(fleet_config(["no-port"]))
    with pytest.raises(ValueError, match="none of the reward servers answers /health"):
        RewardPool(fleet_config(["127.0.0.1:1"]))
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(ValueError, match=TOKEN_ENV):
        RewardPool(fleet_config([address]))


def test_a_server_down_at_start_is_checked_before_its_first_job(servers, tmp_path, monkeypatch):
    """A server that did not answer /health when the job started gets no job until its settings are
    checked: one that comes up scoring with another mode stops the run instead of scoring for it."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    port = free_port()
    with RewardPool(fleet_config([servers[0][1], f"127.0.0.1:{port}"])) as pool:
        late = start_server(
            tmp_path, "late", "--function", LATENCY, "--port", str(port), "--mode", "fraction"
        )
        try:
            for i in range(100):
                pool.submit(i, math_problem(i), answer(i))
            with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} scores with mode='fraction'"):
                list(pool.results(100, timeout=120))
            assert requests.get(f"http://{late[1]}/health", timeout=10).json()["scored"] == 0
        finally:
            stop(late[0])


def test_endpoints_file_is_waited_for(servers, tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    path = tmp_path / "endpoints"
    threading.Timer(1.0, lambda: path.write_text(f"{servers[0][1]}\n{servers[1][1]}\n")).start()
    with RewardPool(RewardConfig(kind="function", function=LATENCY, endpoints_file=str(path))) as pool:
        assert [r.reward for r in pool.score([math_problem(1), math_problem(3)], [answer(1), answer(3)])] == [
            1.0,
            0.0,
        ]
    with pytest.raises(ValueError, match="not written after 0.5 s"):
        RewardPool(
            RewardConfig(
                kind="function", function=LATENCY, endpoints_file=str(tmp_path / "none"), endpoints_wait_s=0.5
            )
        )


@pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh")
def test_the_sandbox_itself_is_served_as_a_recipe_says_and_stops_cleanly(tmp_path, monkeypatch):
    """Started as slurm/train.sbatch starts a job's fleet: from the recipe and its overrides, whose reward
    settings it serves (the recipe's client checks them); SIGINT stops it with exit 0 and its count."""
    recipe = ["grpo_tiny_cpu", "reward.timeout_s=9"]
    proc, address = start_server(tmp_path, "sb", "--workers", "1", *recipe)
    try:
        h = requests.get(f"http://{address}/health", timeout=10).json()
        assert (h["kind"], h["mode"], h["timeout_s"], h["memory_mb"]) == ("sandbox", "fraction", 9.0, 512)
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        tests = "assert f(1) == 2\n"
        problem = Problem(id="inc", prompt="p", tests=tests, entry_point="f")
        code = [
            "def f(x):\n    return x + 1\n",
            "def f(x):\n    return x\n",
            "import os\ndef f(x):\n    os._exit(0)\n",
        ]
        cfg = RewardConfig(kind="sandbox", mode="fraction", timeout_s=9.0, endpoints=[address])
        with RewardPool(cfg) as pool:
            results = pool.score([problem] * 3, code)
        assert [(r.status, r.reward) for r in results] == [("passed", 1.0), ("failed", 0.0), ("crashed", 0.0)]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        log = (tmp_path / "sb.log").read_text()
        assert f"reward-server on {address} stopped after scoring 3 samples" in log and "Traceback" not in log
    finally:
        stop(proc)
    both = subprocess.run(
        [sys.executable, "-m", "megatron_rl.cli", "reward-server", "--mode", "fraction", *recipe],
        cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert both.returncode == 2 and "give a recipe or --mode, not both" in both.stderr, both.stderr


class _Judge(http.server.BaseHTTPRequestHandler):
    calls: list = []
    fail_first = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((body, self.headers.get("Authorization")))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(502)
            self.end_headers()
            return
        if body["completion"] == "garbage":
            out = b"not json"
        else:
            out = json.dumps({"reward": 0.25 if "good" in body["completion"] else 0.0}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_http_judge_posts_each_sample_and_retries(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("JUDGE_KEY", "k3y")
        url = f"http://127.0.0.1:{server.server_address[1]}/judge"
        cfg = RewardConfig(kind="http", url=url, http_token_env="JUDGE_KEY", http_retries=2, workers=1)
        _Judge.fail_first = 1  # a 502 first: tried again
        with RewardPool(cfg) as pool:
            results = pool.score([math_problem(1)] * 3, ["a good one", "a bad one", "garbage"])
        assert [(r.reward, r.status) for r in results[:2]] == [(0.25, "failed"), (0.0, "failed")]
        assert results[2].status == "sandbox_error" and "Expecting value" in results[2].output_tail
        bodies = [c[0] for c in _Judge.calls]
        assert len(bodies) == 4 and bodies[0] == bodies[1]  # the retried request, then the other two
        assert bodies[0] == {"prompt": "1+1?", "completion": "a good one", "problem_id": "m1", "answer": "2"}
        assert {c[1] for c in _Judge.calls} == {"Bearer k3y"}
        with pytest.raises(ValueError, match="reward.url must be an http"):
            RewardPool(RewardConfig(kind="http", url="judge.local"))
    finally:
        server.shutdown()


def test_the_fleet_benchmark_runs():
    """benchmarks/reward_fleet.py in a smoke mode: its JSON holds each measurement, the lost server's
    run scored every sample once."""
    done = subprocess.run(
        [sys.executable, "benchmarks/reward_fleet.py", "--samples", "24", "--repeats", "1", "--overhead-samples", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["throughput"]["one_server_per_s"] > 0 and out["throughput"]["scaling"] > 0
    assert out["overhead"]["remote_ms_per_sample"] > 0
    lost = out["lost_server"]
    assert lost["each_scored_once"] and lost["all_correct"] and lost["results"] == 24
