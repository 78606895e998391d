"""Patches that let megatron-core 0.16 run on CPU with gloo. Applied explicitly, never on import.

megatron-core assumes CUDA in a handful of places. Each patch below names the megatron-core function
it serves; `apply_cpu_patches()` applies them only when CUDA is unavailable, and the unit tests
check, for each one, that megatron-core still fails without it and works with it, so an upgrade
that makes a patch unnecessary (or insufficient) is noticed.

On a GPU machine none of this runs: the same trainer code uses NCCL and the real CUDA paths.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

_APPLIED: list[str] = []
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Patch:
    name: str
    serves: str  # the megatron-core function(s) that need it
    apply: Callable[[], None]


def _rng() -> None:
    # CudaRNGStatesTracker.add/fork (used by DotProductAttention.forward even with dropout 0) read and
    # write CUDA generator state; route them to the CPU generator.
    import megatron.core.tensor_parallel.random as R

    R._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    R._set_cuda_rng_state = lambda new_state, *a, **k: torch.set_rng_state(new_state)
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)


_COMPUTE = torch.device("cpu")


def _current_device() -> None:
    # RotaryEmbedding.forward, ColumnParallelLinear/RowParallelLinear init, p2p buffers and the DDP
    # grad buffers allocate on torch.cuda.current_device(); the MoE router moves its weight there on
    # every forward when it sits on "cpu" (TopKRouter.gating). The compute device as a torch.device, as
    # the trainer names its own (trainer/device_guard.py reads the string "cpu" as the host: a copy).
    torch.cuda.current_device = lambda: _COMPUTE


class _CudaLiteralToCpu(torch.overrides.TorchFunctionMode):
    """Rewrites device='cuda' in factory calls and makes Tensor.cuda() a no-op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and str(dev).startswith("cuda"):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


_MODES = threading.local()


def _cuda_literal() -> None:
    # pipeline_parallel/schedules.py allocates with device="cuda" and calls Tensor.cuda() (loss
    # reduction, forward_backward_pipelining_*). A TorchFunctionMode only covers the thread that
    # entered it: `enter_cuda_literal_mode()` must be called on any other thread that runs megatron.
    enter_cuda_literal_mode()


def enter_cuda_literal_mode() -> None:
    if not getattr(_MODES, "entered", False):
        _CudaLiteralToCpu().__enter__()
        _MODES.entered = True


def _synchronize() -> None:
    # p2p_communication._communicate (batch_p2p_sync=True) and dist_checkpointing's loaders call
    # torch.cuda.synchronize().
    torch.cuda.synchronize = lambda *a, **k: None


_ORIG_TYPE = torch.Tensor.type


def _type_string(self, *args, **kwargs):
    if not args and not kwargs:
        t = _ORIG_TYPE(self)
        if t.startswith("torch.") and not t.startswith("torch.cuda."):
            return t.replace("torch.", "torch.cuda.", 1)
        return t
    return _ORIG_TYPE(self, *args, **kwargs)


def _tensor_type() -> None:
    # optimizer/clip_grads.py (get_grad_norm_fp32, clip_grad_by_total_norm_fp32) and
    # optimizer/distrib_optimizer.py (_build_model_and_main_param_groups) accept only tensors whose
    # type() is 'torch.cuda.FloatTensor' / 'torch.cuda.BFloat16Tensor'.
    torch.Tensor.type = _type_string


class _CpuEvent:
    """torch.cuda.Event replacement timing on the host clock."""

    def __init__(self, *args, **kwargs):
        self.t: float | None = None

    def record(self, *args, **kwargs) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, *args, **kwargs) -> None:
        pass

    def elapsed_time(self, end: _CpuEvent) -> float:
        return (end.t - self.t) * 1000.0


def _event() -> None:
    # megatron.core.inference's TextGenerationController times steps with torch.cuda.Event.
    torch.cuda.Event = _CpuEvent


def _optimizer_step_state() -> None:
    # Without apex/transformer-engine the distributed optimizer wraps torch's Adam, whose per-param state
    # holds a `step` tensor. DistributedOptimizer.load_state_dict puts `step` into that state, then
    # load_parameter_state_from_fully_reshardable skips `step` in what it read while
    # _set_main_param_and_optimizer_states copies every key of the state: KeyError('step') on resume.
    # Copy only the keys that were read; `step` was already set from the checkpoint's param groups.
    from megatron.core.optimizer import distrib_optimizer as D

    orig = D.DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(orig, "_megatron_rl_patched", False):
        return

    def patched(self, model_param, tensors):
        if "step" in tensors or getattr(D, "HAVE_APEX_OR_TE", True):
            return orig(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        state = self.optimizer.state[main_param]
        step = state.pop("step", None)
        try:
            return orig(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    patched._megatron_rl_patched = True
    D.DistributedOptimizer._set_main_param_and_optimizer_states = patched


def _moe_router_gemm() -> None:
    # moe_utils imports `te_general_gemm` inside a try whose except branch leaves the name undefined, and
    # RouterGatingLinearFunction tests `te_general_gemm is not None`: a NameError in every MoE router
    # without transformer-engine. Defining it as None takes megatron-core's own torch matmul path.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


PATCHES: tuple[Patch, ...] = (
    Patch("rng", "tensor_parallel.random.CudaRNGStatesTracker.add/fork", _rng),
    Patch(
        "current_device",
        "RotaryEmbedding.forward, tensor_parallel layers, p2p and grad buffers",
        _current_device,
    ),
    Patch("cuda_literal", "pipeline_parallel.schedules (device='cuda', Tensor.cuda())", _cuda_literal),
    Patch("synchronize", "p2p_communication._communicate(batch_p2p_sync), dist_checkpointing", _synchronize),
    Patch("tensor_type", "optimizer.clip_grads, optimizer.distrib_optimizer type() checks", _tensor_type),
    Patch("event", "inference TextGenerationController (torch.cuda.Event)", _event),
    Patch(
        "moe_router_gemm", "moe_utils.RouterGatingLinearFunction (MoE router without TE)", _moe_router_gemm
    ),
    Patch(
        "optimizer_step_state",
        "DistributedOptimizer._set_main_param_and_optimizer_states (resume with torch Adam, no apex/TE)",
        _optimizer_step_state,
    ),
)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def apply_cpu_patches(only: list[str] | None = None, force: bool = False) -> list[str]:
    """Apply the CPU patches (all, or those named) when CUDA is absent. Returns the names applied.

    Idempotent. `force` is for tests that check a patch on a machine that has CUDA.
    """
    if cuda_available() and not force:
        return []
    with _LOCK:
        for p in PATCHES:
            if (only is None or p.name in only) and p.name not in _APPLIED:
                p.apply()
                _APPLIED.append(p.name)
        if "cuda_literal" in _APPLIED:
            enter_cuda_literal_mode()  # this thread too, if another thread applied first
        return list(_APPLIED)


def applied_patches() -> list[str]:
    return list(_APPLIED)
