"""The runtime inside one warm sandbox: a pristine zygote, and per job a test runner and a solution process.

Standard library only. `sandbox.py` starts it under bubblewrap as `python -I -S -c <bootstrap>` with
this module and the rest of the runtime passed in as source: nothing of the project is on disk there.
Here: Z and T. The solution process U is `solution.py`; what each process sets up for itself
(namespaces, capabilities, rlimits, descriptors) is `jobproc.py`.

Trust model
-----------
Untrusted: the completion's code and everything it can reach. Trusted: this runtime, the problem's
tests, and the host. The sandbox (bubblewrap; see `sandbox.py`) keeps the code from the network, the
host's files and other processes; inside it, each job is split so the verdict cannot be forged:

    host ──ctrl socket──> Z zygote (never sees a job's content; keeps the next job's T ready)
                          └─ T test runner: PID 1 of the job, in new user, mount, PID, IPC and network
                             namespaces with a fresh tmpfs on /tmp; holds the tests and the result pipe
                             └─ U solution: rlimited, no capabilities, seccomp-filtered, own session

- Per-test verdicts are computed in T, which never executes the solution's code. T reaches U only by
  messages: calls go out as encoded arguments, answers come back through `wire.decode`, which builds
  exact built-in values. Comparisons, truth tests and hashing of what U returned run on those plain
  values, in T; objects with a rigged `__eq__` cannot cross (they arrive as opaque handles that refuse
  comparison). Monkeypatching anything in U changes nothing in T. U announces only the entry point and
  the interface the problem declares (the tests bind nothing else from it: testplan rule 6); after a
  call whose arguments hold mutable
  values it reports their new contents, which T writes back into the tests' own objects.
- What a unit must prove to pass is gathered in T as the tests run (`proof.py`: every assertion of
  the unit ran and held, no AssertionError passed through the tests' code even if caught); U cannot
  reach the counts, and what it cannot make T see proven fails.
- Only T holds the result pipe. U is forked before T reads the tests and closes every descriptor but
  its own channel; T is non-dumpable and has dropped its capabilities, so U can neither open
  /proc/T/fd nor ptrace T. Whatever U writes to stdout is output, never a verdict, and `sys.exit(0)` or
  `os._exit(0)` in U only ends U: a job with no answers from U scores no tests.
- U never holds the tests in memory (it is forked before T reads them), nor any other sample's code:
  Z receives only descriptors and limits; the host writes the code and tests into per-job pipes.
- T is PID 1 of the job's PID namespace: U cannot signal it (the kernel drops signals to a namespace's
  init from inside unless it installed a handler, and SIGKILL never reaches it), and when T exits the
  kernel kills every process left in the namespace, so no daemon outlives its job. U runs in a session
  of its own, so `kill(0, sig)` reaches only its own group, never Z (which shares its uid outside
  the job's namespaces); a signal U sends itself is its own crash, reported `crashed` with the signal's
  name, and leaves the sandbox running.
- Nothing passes from one job to the next: the per-job mount namespace gives each job a fresh,
  size-capped /tmp and /dev/shm, the IPC namespace fresh System V objects, and the per-job network
  namespace fresh sockets (no TIME_WAIT entries in /proc/net/tcp, no abstract unix sockets).
- U may not create namespaces or mount anything (the seccomp filter of `seccomp.py`: a user namespace
  of its own would give it the capabilities to mount a tmpfs past its caps), nor trace anything.
- Limits on U: rlimits on CPU seconds, address space, processes, file size and open files; a wall
  deadline enforced by T (which kills U) and, behind it, by the host (which kills the whole sandbox).
  The whole sandbox, so the job with everything it forks, its tmpfs files, memfd and shm, runs in a
  memory cgroup where the host allows one (`memcg.py`, which also says what is left where it does not).
- Problems judged by stdin/stdout pairs run the same split: U compiles the program and runs it afresh
  in a child per pair, input on stdin; T holds the expected outputs and compares (`stdio.py`).
- Z keeps the next job's T ready: cloned into its namespaces, waiting for a job on a socket of its own,
  so creating namespaces is off the critical path. The host plans the tests (`testplan`) once per
  problem and sends the plan, so T does not parse them per job.
What this does not defend against: kernel exploits through the system calls the filter allows.
In unsafe local mode (no bubblewrap, no namespaces) the same split runs, but U could reach the host's
files, network and processes: it exists for machines without user namespaces, and warns loudly.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import time

from megatron_rl.reward import jobproc, seccomp, solution, stdio, testplan, testrunner, wire
from megatron_rl.reward.channel import Channel

_PRELOAD = (
    "array bisect collections copy decimal enum fcntl fractions functools heapq itertools json math numbers "
    "operator random re string typing"
).split()


# ---- T: the trusted test runner ---------------------------------------------------------------


def _trusted_main(job: dict, sol_fd: int, tests_fd: int, result_fd: int) -> None:
    if job["isolate"]:
        jobproc.drop_capabilities()
    else:
        jobproc.libc().prctl(
            jobproc.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0
        )  # orphans come back to us to be killed
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores signals it has no handler for
    deadline = time.monotonic() + job["timeout_s"]
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            solution.solution_main(job, sol_fd, req_r, resp_w, out_w)
        finally:
            os._exit(70)
    for fd in (sol_fd, req_r, resp_w, out_w):
        os.close(fd)
    channel = Channel(pid, req_w, resp_r, out_r, deadline, job)
    try:
        record = _run_job(job, tests_fd, channel)
    except Exception as e:  # our own bug: report it rather than hang the host until its backstop
        record = {"status": "sandbox_error", "passed": 0, "total": 0, "failures": [f"harness error: {e!r}"]}
    channel.finish()
    if not job["isolate"]:
        _kill_descendants()
    record["output_tail"] = channel.tail_text(record.pop("failures", []))
    wire.send_frame(result_fd, record)


def _run_job(job: dict, tests_fd: int, channel: Channel) -> dict:
    tests = wire.read_frame(tests_fd, deadline=channel.deadline)
    os.close(tests_fd)
    entry_point = tests.get("entry_point") or None
    pairs, plan = tests.get("io"), None  # stdin/stdout pairs (stdio.py), or Python tests
    try:
        if pairs is not None:
            total = len(pairs)
        else:
            if "plan" in tests:  # planned by the host (trusted, like the tests themselves)
                plan = testplan.plan_from_wire(tests["plan"])
            else:
                plan = testrunner.plan_tests(tests["tests"], entry_point, tests.get("prefix") or "")
            total = plan.total
    except (SyntaxError, ValueError, TypeError) as e:
        return {"status": "sandbox_error", "passed": 0, "total": 0, "failures": [f"unusable tests: {e}"]}
    load = channel.wait_load()
    if load.get("type") == "SandboxError":
        return {
            "status": "sandbox_error",
            "passed": 0,
            "total": total,
            "failures": [str(load.get("error"))],
        }
    if load.get("load") != "ok":
        status = "syntax_error" if load.get("load") == "syntax_error" else "crashed"
        if load.get("type") == "MemoryError":
            status = "memory"
        status = channel.status_override() or status
        error = f"{load.get('type', '')}: {load.get('error', '')}".strip(": ")
        return {"status": status, "passed": 0, "total": total, "failures": [f"load failed: {error}"]}
    hint = None
    if plan is None:
        outcome, hint = stdio.run_pairs(pairs, channel)
    else:
        names = load.get("names") if isinstance(load.get("names"), list) else []
        values = load.get("values") if isinstance(load.get("values"), dict) else {}
        namespace = testrunner.bind_solution(plan, names, values, channel.request)
        outcome = testrunner.run_units(plan, namespace)
    status = channel.status_override()
    if status is None:
        status = "passed" if outcome.passed == outcome.total else (hint or "failed")
    return {"status": status, "passed": outcome.passed, "total": outcome.total, "failures": outcome.failures}


def _kill_descendants() -> None:
    """Unsafe mode only: kill everything below us, found by parent links, until nothing is left."""
    me = os.getpid()
    for _ in range(50):
        parents: dict[int, int] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        found, frontier = set(), {me}
        while frontier:
            frontier = {p for p, pp in parents.items() if pp in frontier and p not in found}
            found |= frontier
        if not found:
            return
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.005)


# ---- T before its job, and Z: namespaces per job, and the zygote --------------------------


def _spare_main(chan: socket.socket, isolate: bool, tmp_mb: int, ids: tuple[int, int], error: str) -> None:
    """T, before its job: set up the namespaces it was cloned into, then wait for a job and run it.

    The zygote forks the next job's T while the current job runs, so creating the namespaces (a network
    namespace costs milliseconds) is off the job's critical path. T sees only its own socket to the
    zygote; a job arrives on it as limits and pipes. `error`: the zygote could not clone it into fresh
    namespaces (this T was forked plainly to report that to its job).
    """
    gc.disable()  # T is short-lived and allocates little: collecting would only copy pages
    _prefer_as_oom_victim()
    try:
        jobproc.close_all_but({0, 1, 2, chan.fileno()})
        if isolate and not error:
            jobproc.set_up_job_namespaces(ids[0], ids[1], tmp_mb)
    except OSError as e:
        error = f"job set-up failed: {e}"
    jobproc.close_all_but({0, 1, 2, chan.fileno()})
    try:
        msg, fds, _, _ = socket.recv_fds(chan, 1 << 16, 4)
    except OSError:
        os._exit(0)
    if not msg or len(fds) != 3:
        os._exit(0)  # the zygote is gone: this spare's job will never come
    chan.close()
    job = json.loads(msg)
    sol_fd, tests_fd, result_fd = fds
    if error:
        wire.send_frame(result_fd, {"status": "sandbox_error", "passed": 0, "total": 0, "output_tail": error})
        os._exit(3)
    _trusted_main(job, sol_fd, tests_fd, result_fd)
    os._exit(0)


def _prefer_as_oom_victim() -> None:
    """At the memory cgroup's limit the kernel should kill the job, not the zygote (see memcg.py)."""
    libc = jobproc.libc()
    libc.prctl(jobproc.PR_SET_DUMPABLE, 1, 0, 0, 0)  # /proc/self/* is ours to write only while dumpable
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
    except OSError:
        pass  # a kernel without it: the host still reports the OOM kill, at the cost of a restart
    libc.prctl(jobproc.PR_SET_DUMPABLE, 0, 0, 0, 0)


def _fork_spare(isolate: bool, tmp_mb: int, ids: tuple[int, int]) -> tuple[int, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    error = ""
    try:
        pid = jobproc.fork_into_job_namespaces() if isolate else os.fork()
    except OSError as e:  # say so to the job this spare was for, rather than end the sandbox
        error, pid = f"job set-up failed: {e}", os.fork()
    if pid == 0:
        try:
            ours.close()
            _spare_main(theirs, isolate, tmp_mb, ids, error)
        finally:
            os._exit(4)
    theirs.close()
    return pid, ours


def _self_test(isolate: bool) -> str:
    """Fork once through the job namespaces, so a kernel that forbids them fails at start, not per job."""
    if not isolate:
        return ""
    r, w = os.pipe()
    ids = os.getuid(), os.getgid()
    try:
        pid = jobproc.fork_into_job_namespaces()
    except OSError as e:
        return str(e)
    if pid == 0:
        os.close(r)
        try:
            jobproc.set_up_job_namespaces(ids[0], ids[1], 1)
            if seccomp.program() is not None:
                seccomp.install()
            os._exit(0)
        except BaseException as e:
            os.write(w, str(e).encode()[:500])
            os._exit(1)
    os.close(w)
    message = os.read(r, 1000).decode(errors="replace")
    os.close(r)
    os.waitpid(pid, 0)
    return message


def _trim(libc) -> None:
    """Shrink the zygote before it forks anything: every job forks two processes from it (T, U),
    and each fork copies its page tables and each exit unmaps them, which is most of a job's cost
    (measured with perf: ~60% of the CPU a 2-worker pool spends). The bootstrap has already dropped the
    runtime's sources (sandbox.py _BOOT); freed heap goes back to the kernel, so no job maps it."""
    gc.collect()
    trim = getattr(libc, "malloc_trim", None)  # glibc; musl has none
    if trim is not None:
        trim(0)


def zygote_main(argv: list[str]) -> None:
    """Z: serve jobs from the control socket, one at a time, forever (until the host closes it)."""
    args = dict(zip(argv[::2], argv[1::2]))
    ctrl_fd = int(args["--ctrl-fd"])
    isolate = args.get("--isolate", "1") == "1"
    libc = jobproc.libc()
    libc.prctl(jobproc.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for name in _PRELOAD:  # before dropping root: unsafe mode may run from a prefix only root can read
        try:
            __import__(name)
        except ImportError:
            pass
    if "--uid" in args and os.getuid() == 0:
        # Root outside: become an ordinary user. The kernel enforces no process limit on uid 0, and in
        # unsafe mode this is all that stands between `os.kill(-1, SIGKILL)` and every process on the host.
        uid, gid = int(args["--uid"]), int(args["--gid"])
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    libc.prctl(jobproc.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(jobproc.PR_SET_DUMPABLE, 0, 0, 0, 0)
    seccomp.prepare()
    _trim(libc)
    gc.freeze()  # forked jobs then never touch (and copy) the zygote's objects when they collect
    ctrl = socket.socket(fileno=ctrl_fd)
    problem = _self_test(isolate)
    tmp_mb = int(args.get("--tmp-mb", "64"))
    ids = os.getuid(), os.getgid()
    spare = _fork_spare(isolate, tmp_mb, ids) if not problem else None  # ready before the host is told so
    ctrl.send(
        json.dumps(
            {"ready": not problem, "error": problem, "uid": os.getuid(), "python": sys.version}
        ).encode()
    )
    if spare is None:
        return
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 1 << 16, 4)
        except OSError:
            return
        if not msg:
            return
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            ctrl.send(json.dumps({"done": -1, "error": f"expected 3 descriptors, got {len(fds)}"}).encode())
            continue
        pid, chan = spare
        try:
            socket.send_fds(chan, [msg], fds)
        except OSError:  # the spare died before its job came: its waitpid below says how
            pass
        chan.close()
        for fd in fds:
            os.close(fd)
        spare = _fork_spare(isolate, tmp_mb, ids)  # the next job's, prepared while this one runs
        _, status = os.waitpid(pid, 0)
        ctrl.send(json.dumps({"done": os.waitstatus_to_exitcode(status)}).encode())
