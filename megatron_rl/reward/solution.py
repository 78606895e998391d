"""U, the solution process of a sandbox job (`harness.py` says who forks it and what it may not reach):
load the completion, announce the names the tests may bind, and answer the test runner's requests on
them. Everything after `exec` is untrusted, and the test runner knows it. Standard library only:
`sandbox.py` ships it into the sandbox with the rest of the runtime.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import types
from typing import Any

from megatron_rl.reward import jobproc, seccomp, stdio, testrunner, wire


def solution_main(job: dict, sol_fd: int, req_r: int, resp_w: int, out_w: int) -> None:
    """Load the solution and answer T's requests. Everything after `exec` is untrusted, and T knows it."""
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    jobproc.close_all_but({0, 1, 2, sol_fd, req_r, resp_w})
    os.environ.clear()  # bubblewrap started us with none; the interpreter's locale coercion added some
    # A session of its own: `kill(0, sig)` then reaches only U's group, never the zygote, which shares
    # U's uid outside the job's namespaces (and, unsafe, never T: a group T can kill).
    os.setsid()
    msg = wire.read_frame(sol_fd)
    os.close(sol_fd)
    source = msg["code"] if isinstance(msg, dict) and isinstance(msg.get("code"), str) else ""
    stdio_mode = isinstance(msg, dict) and msg.get("stdio") is True  # a program per stdin/stdout pair
    wanted = msg.get("names") if isinstance(msg, dict) and isinstance(msg.get("names"), list) else []
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    jobproc.apply_limits(job)
    gc.enable()  # the program's own reference cycles are collected, as in plain Python (T: off)
    try:
        seccomp.install()
    except OSError as e:
        wire.send_frame(resp_w, {"load": "error", "type": "SandboxError", "error": str(e)[:500]})
        os._exit(0)
    try:
        # dont_inherit: this module's own `from __future__ import annotations` must not apply to the
        # solution (an annotation naming nothing would then pass here and fail in plain Python).
        code = compile(source, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes in the source
        wire.send_frame(resp_w, {"load": "syntax_error", "error": f"{type(e).__name__}: {e}"[:500]})
        os._exit(0)
    except BaseException as e:  # MemoryError/RecursionError from a pathological source
        wire.send_frame(resp_w, {"load": "error", "type": type(e).__name__, "error": str(e)[:500]})
        os._exit(0)
    if stdio_mode:  # not run here: each pair runs it afresh, as __main__ (stdio.py)
        wire.send_frame(resp_w, {"load": "ok", "names": [], "values": {}})
        stdio.serve_programs(code, req_r, resp_w, job["output_limit"])
    module: dict[str, Any] = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, module)
    except BaseException as e:  # SystemExit too: exiting before the tests is a failure
        stdio.print_exception(e)
        wire.send_frame(resp_w, {"load": "error", "type": type(e).__name__, "error": str(e)[:500]})
        os._exit(0)
    # Only the entry point (and the problem's declared interface) is ever bound for the tests
    # (testplan rule 6): nothing else is announced.
    names = [n for n in wanted if isinstance(n, str) and n in module]
    stdio.flush_output()
    wire.send_frame(resp_w, {"load": "ok", "names": names, "values": _plain_values(module, names)})
    _serve(module, req_r, resp_w)


def _plain_values(module: dict, names: list[str]) -> dict[str, Any]:
    """Top-level data the tests may read directly (`ans = 42`), encoded; objects stay remote."""
    values: dict[str, Any] = {}
    budget = wire.MAX_FRAME // 2
    for name in names:
        value = module[name]
        if callable(value) or isinstance(value, types.ModuleType):
            continue
        try:
            encoded = wire.encode(value)
            budget -= len(json.dumps(encoded))
        except Exception:  # not plain data: tests reach it as a remote object
            continue
        if budget < 0:
            break
        values[name] = encoded
    return values


def _serve(module: dict, req_r: int, resp_w: int) -> None:
    handles: dict[int, Any] = {}

    def to_handle(value: Any) -> dict:
        handles[len(handles) + 1] = value
        try:  # its truth, as of now: a lie is no more than returning that bool (testrunner.RemoteObject)
            truth = bool(value)
        except BaseException:
            truth = None
        return {"$h": {"id": len(handles), "type": type(value).__name__[:60], "truth": truth}}

    def resolve(ref: Any) -> Any:
        if isinstance(ref, dict) and "h" in ref:
            return handles[ref["h"]]
        return module[ref["n"]]

    while True:
        req = wire.read_frame(req_r)
        if req is None:
            os._exit(0)
        try:
            op, target = req["op"], resolve(req["ref"])
            if op == "call":
                args = wire.decode(req["args"], resolve)
                kwargs = wire.decode(req["kwargs"], resolve)
                if testrunner.holds_mutable(args) or testrunner.holds_mutable(list(kwargs.values())):
                    _serve_mutating_call(target, args, kwargs, to_handle, resp_w)
                    continue
                value = target(*args, **kwargs)
            elif op == "get":
                value = getattr(target, req["name"])
            elif op == "getitem":
                value = target[wire.decode(req["key"], resolve)]
            elif op == "set":
                setattr(target, req["name"], wire.decode(req["value"], resolve))
                value = None
            elif op == "len":
                value = len(target)
            else:  # "list"
                value = [item for _, item in zip(range(100_001), target)]
            reply = {"ok": wire.encode(value, to_handle)}
        except BaseException as e:  # whatever the solution raised is the answer
            stdio.print_exception(e)
            reply = {"raise": [type(e).__name__, str(e)[:500]]}
        stdio.flush_output()
        wire.send_frame(resp_w, reply)


def _serve_mutating_call(target: Any, args: list, kwargs: dict, to_handle: Any, resp_w: int) -> None:
    """A call whose arguments the solution may change: the reply says what they hold afterwards."""
    try:
        reply: dict[str, Any] = {"ok": wire.encode(target(*args, **kwargs), to_handle)}
    except BaseException as e:
        stdio.print_exception(e)
        reply = {"raise": [type(e).__name__, str(e)[:500]]}
    try:
        reply["mutated"] = [wire.encode(args, to_handle), wire.encode(kwargs, to_handle)]
    except BaseException:  # too deep now, or a hostile object: the test's arguments stay as they were
        pass
    stdio.flush_output()
    wire.send_frame(resp_w, reply)
