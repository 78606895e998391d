"""The trainer's offload before each rollout keeps the model's weights on the device (loop/placement/timeshare.py).

megatron-core's `offload_to_cpu` does `p.data = p.data.cpu()` for every parameter of the optimizer's
groups. With `FP32Optimizer` (fp32 weights without the distributed optimizer) those are the model's own
parameters, so the publication that follows would read host tensors. On CPU nothing is "on the device",
so the parameters and state here report `is_cuda` (as on a GPU) and every `.cpu()` call is recorded: the
test sees which tensors megatron-core's code path, or ours, would move to the host. The optimizers are
megatron-core's own classes (their CUDA loss-scale tensors left out) around a real torch Adam."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from megatron_rl.loop.placement import timeshare


class DeviceParam(torch.nn.Parameter):
    is_cuda = True  # stands for a parameter on the GPU


class DeviceTensor(torch.Tensor):
    is_cuda = True


class RecordMoves(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.moved: set[int] = set()  # data_ptr of every tensor `.cpu()` was called on

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cpu:
            self.moved.add(args[0].data_ptr())
        return func(*args, **(kwargs or {}))


class DDP:
    """megatron-core's DistributedDataParallel as offload_trainer uses it: `.module` and the grad buffers."""

    def __init__(self, module):
        self.module = module

    def offload_grad_buffers(self):
        pass


def _adam_with_state(params) -> torch.optim.Adam:
    adam = torch.optim.Adam(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    adam.step()
    for state in adam.state.values():
        for k, v in state.items():
            state[k] = v.as_subclass(DeviceTensor)
    return adam


def _megatron(cls, adam):
    opt = cls.__new__(cls)  # megatron-core's class; __init__ would make a CUDA loss-scale tensor
    opt.optimizer, opt.is_stub_optimizer = adam, False
    return opt


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(timeshare.torch.cuda, "is_available", lambda: True)


def _model() -> torch.nn.Module:
    model = torch.nn.Linear(4, 3)
    for p in model.parameters():
        p.__class__ = DeviceParam
    return model


def _ptrs(tensors) -> set[int]:
    return {t.data_ptr() for t in tensors}


def test_fp32_optimizer_offload_keeps_the_model_weights_on_the_device(on_gpu):
    from megatron.core.optimizer.optimizer import FP32Optimizer

    model = _model()
    opt = _megatron(FP32Optimizer, _adam_with_state(list(model.parameters())))
    state = [v for s in opt.optimizer.state.values() for v in s.values() if v.dim() > 0]
    with RecordMoves() as rec:
        assert timeshare.offload_trainer(opt, DDP(model)) is True
    assert not rec.moved & _ptrs(model.parameters()), "the model's weights went to the host"
    assert _ptrs(state) <= rec.moved, "the optimizer state still goes to the host"


def test_main_copies_of_a_mixed_precision_optimizer_still_go_to_the_host(on_gpu):
    """Float16OptimizerWithFloat16Params (bf16 weights): its groups hold fp32 copies, which do move."""
    from megatron.core.optimizer.optimizer import ChainedOptimizer, Float16OptimizerWithFloat16Params

    model = _model()
    copies = [DeviceParam(p.detach().clone().float()) for p in model.parameters()]
    opt = _megatron(Float16OptimizerWithFloat16Params, _adam_with_state(copies))
    chained = ChainedOptimizer.__new__(ChainedOptimizer)
    chained.chained_optimizers = [opt]
    with RecordMoves() as rec:
        timeshare.offload_trainer(chained, DDP(model))
    assert _ptrs(copies) <= rec.moved and not rec.moved & _ptrs(model.parameters())
