"""Device discipline for tests on CPU: make the CPU run fail where a GPU run would.

On CPU every tensor is on the same device and every group is gloo, so a tensor created on the host
next to device log-probs, or a host tensor handed to an NCCL collective, works here and crashes at
step 1 on a GPU. With MEGATRON_RL_DEVICE_GUARD=1, `init_parallel` installs two traps first:

1. The device trap (a TorchFunctionMode on the trainer's thread). A tensor factory (`torch.zeros`,
   `torch.tensor`, ...) called without `device=` from trainer-side code (TRAINER_CODE) creates its
   tensor on `meta`: the first op that mixes it with a real one fails ("not on the expected
   device"), as a host tensor would meet a CUDA one. Host bookkeeping must say `device="cpu"`, and
   device work must use the policy's device: a tensor made without a device is a bug either way.
   Host tensors are marked so the collective guard can tell them from device tensors, which on CPU
   share the device: made with `device="cpu"` (the host is named by that string; the policy's
   device is a `torch.device`), or moved with `.cpu()` / `.to("cpu")` (a copy, as on a GPU).
   `.to(<torch.device>)` gives an unmarked (device) tensor.
   Scope: only TRAINER_CODE is trapped. megatron-core, torch and vLLM create host tensors on purpose
   (Adam's `step`, CPU initialisation); the reward, telemetry, planner, data and HF-staging code is
   host-side by design. But host tensors are *marked* in all of megatron_rl (checkpoint save,
   reshard, telemetry included): there a factory without a device makes a host tensor on a GPU too,
   so it is marked host (not moved to meta), as are `.cpu()` / `.to("cpu")` copies made anywhere.
   The mark follows computation: an op whose tensor inputs are all marked host gives a host tensor.

2. The collective guard: `torch.distributed` collectives check their tensors against the kind of
   group they run on, as its backend would on GPU. Groups created with `backend="gloo"` are CPU
   groups (host tensors only); every other group, the default one included, is a device group (NCCL
   on GPU: tensors on the compute device, none marked host). A meta tensor fails anywhere. Object
   collectives (`all_gather_object`, `broadcast_object_list`, `gather_object`, `scatter_object_list`,
   `send_object_list`, `recv_object_list`) from megatron_rl's code are refused on a device group
   whatever their size: NCCL pickles each payload into a device tensor and stages the largest one
   times the world size on every rank (with routing replay on the 30B-A3B recipe, ~4 GB per GPU while
   the engine still holds its KV cache); host objects go over a gloo group. Other code's object
   collectives (megatron-core's dist_checkpointing metadata) may carry at most OBJECT_LIMIT_BYTES.
   Not wrapped: isend/irecv and P2POp, which megatron-core's pipeline schedules build from
   torch's own functions (torch checks the op's identity).

Test support, enabled by an environment variable only; nothing here runs in a normal job.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import sys
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

ENV = "MEGATRON_RL_DEVICE_GUARD"
# Modules whose tensors feed the trainer: the code held to the device rule.
TRAINER_CODE = (
    "megatron_rl.trainer",
    "megatron_rl.algorithms",
    "megatron_rl.loop",
    "megatron_rl.checkpoint.preempt",
    "megatron_rl.train",
)
EXEMPT = ("megatron_rl.trainer.device_guard", "megatron_rl.trainer.cpu_compat")
OBJECT_LIMIT_BYTES = 1 << 20
_HOST = "_megatron_rl_host"  # attribute marking a tensor as a host copy

_FACTORIES = frozenset(
    {
        torch.zeros,
        torch.ones,
        torch.empty,
        torch.full,
        torch.tensor,
        torch.as_tensor,
        torch.arange,
        torch.linspace,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.eye,
    }
)


class DeviceDisciplineError(RuntimeError):
    """A tensor on the wrong device for where it is used (what a GPU run would crash on)."""


# Frames between the caller and this mode: other TorchFunctionModes stacked above it (the CPU
# patches' mode calls `func` from its own handler) and torch's dispatch helpers.
_PASS_THROUGH = (*EXEMPT, "torch.overrides", "torch.utils._device")


def _caller_module(depth: int = 2) -> str:
    frame = sys._getframe(depth)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_PASS_THROUGH):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def _caller_is_trainer_code(depth: int = 2) -> bool:
    return _caller_module(depth + 1).startswith(TRAINER_CODE)


def _all_host(args, kwargs) -> bool:
    """Whether the call's tensor arguments (top level and in lists) exist and are all marked host."""
    seen = False
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, list | tuple) else (a,):
            if isinstance(t, torch.Tensor):
                if not getattr(t, _HOST, False):
                    return False
                seen = True
    return seen


def _to_target(args, kwargs):
    """The device argument of a `Tensor.to(...)` call, or None (a dtype-only conversion)."""
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:2]:
        if isinstance(a, str | torch.device):
            return a
    return None


def _mark(t: torch.Tensor, host: bool, source: torch.Tensor | None = None) -> torch.Tensor:
    """`t` marked as host memory or not; a fresh tensor when `t` is `source` itself (on a GPU the
    move would have made a copy, and the original keeps its own mark)."""
    if source is not None and t is source and getattr(t, _HOST, False) != host:
        t = t.clone()
    setattr(t, _HOST, host)
    return t


class DeviceTrap(torch.overrides.TorchFunctionMode):
    """In trainer code: factories without a device -> meta; `device="cpu"` (the host, named as a
    string), `.cpu()` and `.to("cpu")` -> tensors marked as host memory; `.to(<torch.device>)` (the
    policy's device) -> unmarked."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES or func is torch.Tensor.cpu or func is torch.Tensor.to:
            module = _caller_module()
            if module.startswith(TRAINER_CODE):
                return self._trainer_call(func, args, kwargs)
            out = func(*args, **kwargs)
            if func is torch.Tensor.cpu:
                return _mark(out, host=True, source=args[0])
            if func is torch.Tensor.to:
                target = _to_target(args, kwargs)
                if target is None:
                    return _mark(out, host=True, source=args[0]) if getattr(args[0], _HOST, False) else out
                return _mark(out, host=isinstance(target, str) and target == "cpu", source=args[0])
            if module.startswith("megatron_rl") and not (args and isinstance(args[0], torch.Tensor)):
                # megatron_rl's host-side code: without a device (or with "cpu") a host tensor on GPU too
                device = kwargs.get("device")
                if device is None or (isinstance(device, str) and device == "cpu"):
                    return _mark(out, host=True)
            return out
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not getattr(out, _HOST, False) and _all_host(args, kwargs):
            out = _mark(out, host=True)  # computed from host tensors only: a host tensor on GPU too
        return out

    @staticmethod
    def _trainer_call(func, args, kwargs):
        if func in _FACTORIES:
            device = kwargs.get("device")
            if device is None:
                return func(*args, **{**kwargs, "device": "meta"})
            return _mark(func(*args, **kwargs), host=isinstance(device, str) and device == "cpu")
        if func is torch.Tensor.cpu:
            return _mark(func(*args, **kwargs), host=True, source=args[0])
        target = _to_target(args, kwargs)
        out = func(*args, **kwargs)
        if target is None:  # a dtype conversion stays where it is
            return _mark(out, host=True, source=args[0]) if getattr(args[0], _HOST, False) else out
        return _mark(out, host=isinstance(target, str) and target == "cpu", source=args[0])


# ---- the collective guard --------------------------------------------------------------------

_CPU_GROUPS: dict[int, object] = {}  # id(group) -> group, for groups declared gloo
_STATE = threading.local()
_INSTALLED: dict[str, object] = {}


def _is_cpu_group(group) -> bool:
    return group is not None and id(group) in _CPU_GROUPS


def _kind(group) -> str:
    return "CPU (gloo)" if _is_cpu_group(group) else "device (NCCL on GPU)"


def check_tensor(op: str, t: torch.Tensor, group, compute: torch.device) -> None:
    """Raise DeviceDisciplineError if `t` may not go through collective `op` on `group`."""
    where = f"{op} on a {_kind(group)} group"
    if t.device.type == "meta":
        raise DeviceDisciplineError(
            f"{where} got a tensor created without a device (it landed on meta under the device trap); "
            "create it on the policy's device, or explicitly on the host and use ParallelState.cpu_group"
        )
    if _is_cpu_group(group):
        if t.device.type != "cpu":
            raise DeviceDisciplineError(
                f"{where} got a tensor on {t.device}; a gloo group takes host tensors"
            )
        return
    if getattr(t, _HOST, False) or t.device.type != compute.type:
        raise DeviceDisciplineError(
            f"{where} got a host tensor (moved off the device with .cpu()); NCCL refuses host tensors "
            "('No backend type associated with device type cpu'): keep it on the device until after "
            "the collective, or run it on ParallelState.cpu_group"
        )


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _wrap_tensor_collective(name: str, fn: Callable, compute: torch.device) -> Callable:
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        group = kwargs.get("group")
        if group is None:
            import inspect

            bound = inspect.signature(fn).bind_partial(*args, **kwargs)
            group = bound.arguments.get("group")
        for t in _tensors(list(args) + [v for k, v in kwargs.items() if k != "group"]):
            check_tensor(name, t, group, compute)
        return fn(*args, **kwargs)

    return guarded


def _wrap_batch_p2p(fn: Callable, compute: torch.device) -> Callable:
    @functools.wraps(fn)
    def guarded(p2p_op_list):
        for op in p2p_op_list:
            check_tensor("batch_isend_irecv", op.tensor, op.group, compute)
        return fn(p2p_op_list)

    return guarded


def _wrap_object_collective(name: str, fn: Callable, payload_arg: int) -> Callable:
    import inspect

    signature = inspect.signature(fn)
    payload_name = list(signature.parameters)[payload_arg]

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        if not _is_cpu_group(bound.get("group")):
            caller = _caller_module()
            if caller.startswith("megatron_rl"):
                raise DeviceDisciplineError(
                    f"{name} from {caller} on a device (NCCL on GPU) group: NCCL stages every object "
                    "collective's payload on the GPU (the largest one x world size on each rank); run it on "
                    "a gloo group (ParallelState.cpu_group, Processes.cpu_group / job_cpu_group)"
                )
            size = len(pickle.dumps(bound.get(payload_name)))
            if size > OBJECT_LIMIT_BYTES:
                raise DeviceDisciplineError(
                    f"{name} on a device (NCCL on GPU) group carries {size / 2**20:.1f} MiB: NCCL stages every "
                    "payload on the GPU (the largest one x world size on each rank); send tensors one by one "
                    "to the rank that needs them, or use ParallelState.cpu_group for host objects"
                )
        return fn(*args, **kwargs)

    return guarded


def _wrap_new_group(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        group = fn(*args, **kwargs)
        backend = kwargs.get("backend")
        if backend is not None and str(backend).lower() == "gloo" and group is not None:
            _CPU_GROUPS[id(group)] = group
        return group

    return guarded


_TENSOR_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all_single",
    "send",
    "recv",
)
# name -> the position of its payload argument (what NCCL would stage on the device)
OBJECT_COLLECTIVES = {
    "all_gather_object": 1,
    "broadcast_object_list": 0,
    "gather_object": 0,
    "scatter_object_list": 1,
    "send_object_list": 0,
    "recv_object_list": 0,
}


def compute_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def declare_cpu_group(group) -> None:
    """A gloo group made without `dist.new_group` (loop/placement/pools.py's job group): checked as a CPU group."""
    if _INSTALLED and group is not None:
        _CPU_GROUPS[id(group)] = group


def install() -> None:
    """Enter the device trap on this thread and wrap torch.distributed's collectives. Idempotent."""
    if not getattr(_STATE, "trap", None):
        _STATE.trap = DeviceTrap()
        _STATE.trap.__enter__()
    if _INSTALLED:
        return
    compute = compute_device()
    for name in _TENSOR_COLLECTIVES:
        _INSTALLED[name] = getattr(dist, name)
        setattr(dist, name, _wrap_tensor_collective(name, _INSTALLED[name], compute))
    for name, payload_arg in OBJECT_COLLECTIVES.items():
        _INSTALLED[name] = getattr(dist, name)
        setattr(dist, name, _wrap_object_collective(name, _INSTALLED[name], payload_arg))
    _INSTALLED["batch_isend_irecv"] = dist.batch_isend_irecv
    dist.batch_isend_irecv = _wrap_batch_p2p(dist.batch_isend_irecv, compute)
    _INSTALLED["new_group"] = dist.new_group
    dist.new_group = _wrap_new_group(dist.new_group)


def uninstall() -> None:
    """Undo `install` (tests that install it in their own process)."""
    trap = getattr(_STATE, "trap", None)
    if trap is not None:
        trap.__exit__(None, None, None)
        _STATE.trap = None
    for name, fn in _INSTALLED.items():
        setattr(dist, name, fn)
    _INSTALLED.clear()
    _CPU_GROUPS.clear()


def install_from_env() -> bool:
    """Install when MEGATRON_RL_DEVICE_GUARD=1 (set by tests). Returns whether it is installed."""
    if os.environ.get(ENV, "") not in ("1", "true", "yes"):
        return False
    install()
    logging.getLogger(__name__).warning(
        "%s=1: device guard installed (tensors without a device -> meta; collectives checked)", ENV
    )
    return True
