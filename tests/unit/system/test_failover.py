"""The failover's rules (system/failover.py): which node a failed step blames, where the run goes next,
and which errors are the machines' rather than the run's. Each rule is checked by hand-made records, and
the error classes against a real gloo pair whose peer is killed or stops answering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from megatron_rl.system.failover import (
    EXIT_NODE_FAULT,
    EXIT_PEER_LOST,
    Beat,
    EngineCrashed,
    ExitRecord,
    after,
    blame,
    exit_code_for,
    pick,
    read_beats,
    read_exit_records,
)
from tests.helpers.launch import REPO, free_port

NODES = ["n1", "n2", "n3", "n4"]


def _beat(rank: int, host: str, t: float, interval: float = 1.0) -> Beat:
    return Beat(rank, host, 1000 + rank, t, interval, "generation")


def test_a_killed_rank_blames_its_node_and_its_peers_witness_only():
    records = [ExitRecord(10.0, 137, 1, "n2"), ExitRecord(11.0, EXIT_PEER_LOST, 0, "n1")]
    assert blame(records, []) == {"n2": "rank 1 was killed by SIGKILL"}
    v = after(137, records, [], ["n1", "n2"], NODES, set(), 0, 3)
    assert (v.action, v.nodes, set(v.blamed)) == ("retry", ("n1", "n3"), {"n2"})


def test_a_rank_that_stopped_beating_is_the_hung_one():
    """Its peers timed out (exit 76) while it made no exit record: the stale heartbeat names it."""
    records = [ExitRecord(70.0, EXIT_PEER_LOST, 0, "n1")]
    beats = [_beat(0, "n1", 70.0), _beat(1, "n3", 9.0)]
    blamed = blame(records, beats)
    assert list(blamed) == ["n3"] and "hung" in blamed["n3"] and "61 s" in blamed["n3"]
    v = after(EXIT_PEER_LOST, records, beats, ["n1", "n3"], NODES, {"n2"}, 1, 3)
    assert (v.action, v.nodes) == ("retry", ("n1", "n4"))


def test_a_hung_rank_woken_to_be_killed_is_still_the_hung_one():
    """Slurm sends SIGCONT before it kills a step: the stopped rank beats once more, fresh, but its beat
    carries the silence that spans its peer's failure."""
    records = [ExitRecord(70.0, EXIT_PEER_LOST, 0, "n1")]
    woken = Beat(1, "n3", 1001, 76.0, 1.0, "generation", gap=(9.0, 75.5))
    assert list(blame(records, [_beat(0, "n1", 70.5), woken])) == ["n3"]
    earlier = Beat(
        1, "n3", 1001, 76.0, 1.0, "init", gap=(1.0, 30.0)
    )  # a silence long before: not this failure
    assert blame(records, [_beat(0, "n1", 70.5), earlier]) == {}


def test_a_beat_a_little_late_is_not_a_hang():
    beats = [_beat(0, "n1", 100.0, interval=2.0), _beat(1, "n2", 100.0 - 15.9, interval=2.0)]
    assert blame([], beats) == {}  # 3 x 2 s + 10 s of slack
    assert list(blame([], [beats[0], _beat(1, "n2", 100.0 - 16.1, interval=2.0)])) == ["n2"]


def test_an_engine_crash_blames_its_node():
    records = [ExitRecord(5.0, EXIT_NODE_FAULT, 3, "n2")]
    assert "engine" in blame(records, [])["n2"]


def test_an_error_of_the_run_is_not_retried_anywhere():
    """Exit 1 (a bug, a bad input): another node would fail the same way."""
    v = after(1, [ExitRecord(5.0, 1, 0, "n1")], [], ["n1", "n2"], NODES, set(), 0, 3)
    assert v.action == "stop" and "not of a node" in v.why
    for rc in (0, 2, 75):
        assert after(rc, [], [], ["n1"], NODES, set(), 0, 3).action == "stop"
    # fail closed: a failure no record explains (torchrun's launcher writes none) is not taken for a node's
    v = after(1, [], [], ["n1", "n2"], NODES, set(), 0, 3)
    assert v.action == "stop" and "the step ended with exit code 1" in v.why
    assert after(137, [], [], ["n1", "n2"], NODES, set(), 0, 3).action == "retry"


def test_every_node_of_a_multi_node_step_failing_is_not_a_node_fault():
    records = [ExitRecord(1.0, 137, 0, "n1"), ExitRecord(1.1, 137, 1, "n2")]
    v = after(137, records, [], ["n1", "n2"], NODES, set(), 0, 3)
    assert v.action == "stop" and "not in one node" in v.why
    # ... while the one node of a one-node run is replaced
    v = after(137, records[:1], [], ["n1"], NODES, set(), 0, 3)
    assert (v.action, v.nodes) == ("retry", ("n2",))


def test_no_spare_left_restarts_on_the_same_nodes_and_restarts_are_bounded():
    records = [ExitRecord(1.0, EXIT_NODE_FAULT, 1, "n2")]
    v = after(EXIT_NODE_FAULT, records, [], ["n1", "n2"], ["n1", "n2"], set(), 0, 3)
    assert (v.action, v.nodes) == ("retry", ("n1", "n2")) and "--exclude=n2" in v.why
    v = after(EXIT_NODE_FAULT, records, [], ["n1", "n2"], NODES, set(), 3, 3)
    assert v.action == "stop" and "cluster.max_restarts=3" in v.why
    # nothing to blame (no records, every beat fresh): the same nodes again
    v = after(
        EXIT_PEER_LOST, [ExitRecord(1.0, EXIT_PEER_LOST, 0, "n1")], [], ["n1", "n2"], NODES, set(), 0, 3
    )
    assert (v.action, v.nodes, v.blamed) == ("retry", ("n1", "n2"), {})


def test_pick_keeps_allocation_order_and_names_the_lack():
    assert pick(NODES, {"n1", "n3"}, 2) == ["n2", "n4"]
    with pytest.raises(LookupError, match="1 healthy node"):
        pick(NODES, {"n1", "n2", "n3"}, 2)


def test_the_step_files_are_read_and_a_broken_record_is_an_error(tmp_path):
    (tmp_path / "rank1").write_text("12.5 137 1 n2\n")
    (tmp_path / "rank0").write_text("13.0 76 0 n1\n")
    (tmp_path / "beat.rank0").write_text(json.dumps(dict(rank=0, host="n1", pid=7, time=3.0, interval_s=1.0)))
    (tmp_path / "beat.rank1.tmp").write_text("half a reco")
    assert [r.rank for r in read_exit_records(tmp_path)] == [1, 0]
    assert [(b.rank, b.host) for b in read_beats(tmp_path)] == [(0, "n1")]
    (tmp_path / "rank2").write_text("13.0\n")
    with pytest.raises(ValueError, match="rank2"):
        read_exit_records(tmp_path)


def test_the_cli_speaks_the_scripts_words(tmp_path):
    (tmp_path / "rank1").write_text("12.5 137 1 n2\n")
    cmd = [sys.executable, "-m", "megatron_rl.cli.failover", "after", "--exit-dir", str(tmp_path)]
    cmd += ["--rc", "137", "--used", "n1,n2", "--allocated", "n1 n2 n3", "--bad", "", "--restarts", "0"]
    out = subprocess.run([*cmd, "--max", "2"], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["retry", "n1,n3", "n2"]
    assert "== node n2 failed: rank 1 was killed by SIGKILL" in out.stderr
    pick = [
        sys.executable,
        "-m",
        "megatron_rl.cli.failover",
        "pick",
        "--allocated",
        "n1 n2 n3",
        "--bad",
        "n1",
    ]
    assert subprocess.run(pick, capture_output=True, text=True, cwd=REPO).stdout.split() == ["n2,n3"]
    one = subprocess.run([*pick, "--need", "1"], capture_output=True, text=True, cwd=REPO)
    assert one.stdout.split() == ["n2"]
    lack = subprocess.run([*pick, "--need", "3"], capture_output=True, text=True, cwd=REPO)
    assert lack.returncode == 1 and "2 healthy node(s) of the 3 the run needs" in lack.stderr
    nodes = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_rl.cli.failover",
            "nodes",
            "grpo_tiny_cpu",
            "cluster.max_restarts=5",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert nodes.stdout.split() == ["1", "5"]


def test_engine_and_device_failures_are_the_nodes_and_others_the_runs():
    assert exit_code_for(EngineCrashed("vLLM died"))[0] == EXIT_NODE_FAULT
    assert (
        exit_code_for(RuntimeError("CUDA error: an illegal memory access was encountered"))[0]
        == EXIT_NODE_FAULT
    )
    assert exit_code_for(ValueError("bad recipe")) is None
    # the run's own errors in a collective's words are the run's: not raised inside torch.distributed
    assert exit_code_for(RuntimeError("Timed out waiting for the judge's answer")) is None
    assert exit_code_for(BrokenPipeError("[Errno 32] Broken pipe")) is None
    assert exit_code_for(ConnectionRefusedError("[Errno 111] Connection refused")) is None
    # a device out of memory is the run's size, on any node
    assert exit_code_for(RuntimeError("CUDA error: out of memory")) is None
    assert exit_code_for(KeyError("x")) is None


_PAIR = textwrap.dedent(
    """
    import os, signal, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from megatron_rl.system.failover import exit_code_for
    mode, rank = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=3))
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(20)
        sys.exit(0)
    try:
        dist.all_reduce(t)
    except Exception as e:
        print(exit_code_for(e)[0])
    """
)


@pytest.mark.parametrize("mode", ["kill", "hang"])
def test_a_real_gloo_peer_lost_or_hung_is_classified_as_lost(mode):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO)}
    peer = subprocess.Popen([sys.executable, "-c", _PAIR, mode, "1"], env=env, cwd=REPO)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PAIR, mode, "0"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        peer.kill()
        peer.wait()
    assert out.stdout.strip() == str(EXIT_PEER_LOST), out.stderr[-2000:]


def _verdict(exclude=(), job_failures=()) -> dict:
    """The shape of `megatron-rl preflight --out`'s JSON (rank 0's), as the batch script reads it."""
    return {
        "cluster": "h100_80gb",
        "exclude": list(exclude),
        "job_failures": list(job_failures),
        "passed": False,
    }


def test_a_node_failing_the_preflight_is_left_out_while_spares_last():
    from megatron_rl.system.failover import after_preflight

    assert after_preflight(None, 0, NODES, set(), 2) == ("ok", [])
    assert after_preflight(_verdict(["n2"]), 3, NODES, set(), 2) == ("spare", ["n2"])
    assert after_preflight(_verdict(["n2", "n3"]), 3, NODES, set(), 2) == ("spare", ["n2", "n3"])
    assert after_preflight(_verdict(["n2", "n3"]), 3, NODES, {"n4"}, 2) == ("stop", ["n2", "n3"])
    assert after_preflight(_verdict([], ["ring 0.1 GB/s < 25 GB/s"]), 1, NODES, set(), 2) == ("ring", [])
    # fail closed: a failed preflight whose verdict is missing, unreadable or names nothing is refused
    assert after_preflight(None, 3, NODES, set(), 2) == ("refused", [])
    assert after_preflight(["n2"], 3, NODES, set(), 2) == ("refused", [])
    assert after_preflight(_verdict(), 1, NODES, set(), 2) == ("refused", [])


def test_the_cli_reads_the_preflights_file_and_a_broken_one_is_refused(tmp_path):
    verdict = tmp_path / "preflight.json"
    cmd = [sys.executable, "-m", "megatron_rl.cli.failover", "preflight", "--json", str(verdict), "--rc", "3"]
    cmd += ["--allocated", "n1 n2 n3", "--need", "2"]
    verdict.write_text(json.dumps(_verdict(["n1"])))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["spare", "n1"]
    verdict.write_text('{"exclude": ["n1"')
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["refused", "-"]
