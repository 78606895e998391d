"""The device trap and the collective guard (trainer/device_guard.py), in one process on gloo.

Each check is paired with the input that must trip it: a tensor made without a device, a host
copy handed to a device group, an oversized object over a device group, a host flag on the
default group. On CPU none of these fail without the guard; on a GPU each one crashes.
"""

import types

import pytest
import torch
import torch.distributed as dist

from megatron_rl.checkpoint.preempt import Preemption
from megatron_rl.trainer import device_guard as G
from megatron_rl.trainer.batch import make_microbatches
from tests.helpers.launch import free_port

PROBE = """
import torch

def undeviced():
    return torch.zeros(3)

def host(n):
    return torch.zeros(n, device="cpu")

def on(device):
    return torch.zeros(3, device=device)

def to_host(t):
    return t.cpu()

def to_device(t, device):
    return t.to(device)

def gather(obj, group=None):
    import torch.distributed as dist
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out

def broadcast(box, group=None):
    import torch.distributed as dist
    dist.broadcast_object_list(box, 0, group)  # the group passed positionally
    return box
"""


@pytest.fixture(scope="module")
def guarded():
    """The guard installed, then a world-1 gloo job with one CPU group (as init_parallel makes)."""
    G.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    cpu_group = dist.new_group(backend="gloo")
    probe = types.ModuleType("megatron_rl.loop._guard_probe")  # counts as trainer code
    exec(PROBE, probe.__dict__)
    yield types.SimpleNamespace(cpu_group=cpu_group, probe=probe)
    dist.destroy_process_group()
    G.uninstall()


def test_trainer_tensors_without_a_device_land_on_meta_and_fail_when_mixed(guarded):
    p = guarded.probe
    assert p.undeviced().device.type == "meta"
    assert torch.zeros(3).device.type == "cpu", "code outside the trainer is not trapped"
    with pytest.raises(RuntimeError, match="meta"):
        p.undeviced() + torch.ones(3)
    assert p.on(torch.device("cpu")).device.type == "cpu"
    # With the CPU patches' own mode stacked above the trap (as in every trainer process on CPU),
    # the trap still sees the real caller, not the other mode's handler.
    from megatron_rl.trainer.cpu_compat import _CudaLiteralToCpu

    with _CudaLiteralToCpu():
        assert p.undeviced().device.type == "meta"
        assert p.on(torch.device("cpu")).device.type == "cpu"
        assert getattr(p.to_host(p.on(torch.device("cpu"))), G._HOST)


def test_host_marks_follow_moves(guarded):
    p = guarded.probe
    device_t = p.on(torch.device("cpu"))
    host_t = p.to_host(device_t)
    assert host_t is not device_t, "a move to the host is a copy, as on a GPU"
    assert getattr(host_t, G._HOST) and not getattr(device_t, G._HOST)
    assert getattr(p.host(2), G._HOST)
    assert not getattr(p.to_device(host_t, torch.device("cpu")), G._HOST)


def test_collectives_refuse_what_a_gpu_refuses(guarded):
    p = guarded.probe
    with pytest.raises(G.DeviceDisciplineError, match="without a device"):
        dist.all_reduce(p.undeviced())
    with pytest.raises(G.DeviceDisciplineError, match="host tensor"):
        dist.broadcast(p.to_host(p.on(torch.device("cpu"))), src=0)
    with pytest.raises(G.DeviceDisciplineError, match="host tensor"):
        dist.all_reduce(p.host(1))
    # ... and let through what a GPU accepts.
    dist.all_reduce(p.on(torch.device("cpu")))
    dist.all_reduce(p.host(1), group=guarded.cpu_group)
    dist.broadcast(p.host(1), 0, guarded.cpu_group)  # the group passed positionally


def test_our_object_collectives_on_a_device_group_fail_whatever_their_size(guarded):
    """NCCL stages every object collective's payload on the GPU: ours go over a gloo group, always."""
    p = guarded.probe
    with pytest.raises(G.DeviceDisciplineError, match="all_gather_object from megatron_rl.loop._guard_probe"):
        p.gather({"k": 1})
    with pytest.raises(G.DeviceDisciplineError, match="broadcast_object_list .* device"):
        p.broadcast([1])
    assert p.gather({"k": 1}, group=guarded.cpu_group) == [{"k": 1}]
    assert p.broadcast([1], guarded.cpu_group) == [1]
    wrapped = {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
               "send_object_list", "recv_object_list"}  # fmt: skip
    assert set(G.OBJECT_COLLECTIVES) == wrapped
    assert all(getattr(dist, name) is not G._INSTALLED[name] for name in wrapped)


def test_other_codes_object_collectives_on_device_groups_stay_small(guarded):
    """megatron-core's own (dist_checkpointing metadata) are its business, up to a size."""
    out = [None]
    dist.all_gather_object(out, {"k": 1})
    big = torch.zeros(G.OBJECT_LIMIT_BYTES // 4 + 16)
    with pytest.raises(G.DeviceDisciplineError, match="MiB"):
        dist.all_gather_object(out, {"stage": big})
    dist.all_gather_object(out, {"stage": big}, group=guarded.cpu_group)


def test_preemption_agrees_on_the_cpu_group(guarded):
    assert Preemption(guarded.cpu_group).requested() is False
    flagged = Preemption(guarded.cpu_group)
    flagged.flag = True
    assert flagged.requested() is True
    # Without the CPU group its host flag would go to the default group: NCCL on a GPU.
    with pytest.raises(G.DeviceDisciplineError, match="host tensor"):
        Preemption().requested()


def test_microbatches_and_their_extras_are_on_the_policy_device(guarded):
    from megatron_rl.loop.step.rl_batch import grpo_loss_fn

    seqs, plens = [[1, 2, 3, 4, 5], [6, 7, 8]], [2, 1]
    extras = {k: [torch.full((3,), 0.5), torch.full((2,), 0.5)] for k in ("adv", "old", "rollout")}
    extras["keep"] = [torch.ones(3), torch.ones(2)]
    device = torch.device("cpu")
    (mb,) = make_microbatches(seqs, plens, 2, extras=extras, device=device)
    tensors = [mb.tokens_BS, mb.position_ids_BS, mb.loss_mask_BT, *mb.extras.values()]
    assert all(t.device == device and not getattr(t, G._HOST, False) for t in tensors)
    algo = types.SimpleNamespace(
        loss_agg="token-mean", kl_in_reward=False, kl_coef=0.0, clip_low=0.2, clip_high=0.2,
        kl_estimator="k3", truncated_is_cap=0.0,
    )  # fmt: skip
    lp = guarded.probe.on(device).new_zeros(mb.loss_mask_BT.shape).requires_grad_()
    loss, _ = grpo_loss_fn(algo, 8, 5.0)(lp, mb)
    loss.backward()
    assert lp.grad is not None and torch.isfinite(lp.grad).all()


def test_the_engines_log_probs_as_the_old_ones_are_made_on_the_host(guarded):
    """algorithm.old_logprobs=engine: the loop builds the old log-probs from the engine's lists. Made
    without a device they were meta under the trap, and the microbatch's copy failed (a GPU puts them
    on whatever device is current)."""
    from megatron_rl.loop.step.rl_batch import engine_logprobs
    from megatron_rl.rollout.types import Sample

    samples = [Sample(0, i, [1, 2], [3, 4, 5], [-0.5, -1.0, -1.5], "stop", False, 1) for i in range(2)]
    old = engine_logprobs(samples, [0, 1])
    assert all(t.device.type == "cpu" and t.tolist() == [-0.5, -1.0, -1.5] for t in old.values())
    (mb,) = make_microbatches([s.prompt_ids + s.token_ids for s in samples], [2, 2], 2,
                              extras={"old": [old[0], old[1]]}, device=torch.device("cpu"))  # fmt: skip
    assert mb.extras["old"][0, 1:4].tolist() == [-0.5, -1.0, -1.5]
