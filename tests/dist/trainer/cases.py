"""Shared definitions of the trainer's multi-process checks (worker and test both import these)."""

import torch

# (spec, TP, PP, micro-batch size): several sequences per microbatch through a pipeline once caught
# log-probs sent between stages as a transposed view (gloo ships raw memory).
LOGPROB_CASES = [
    ("qwen2_tiny", 1, 1, 1),
    ("qwen2_tiny", 2, 1, 1),
    ("qwen2_tiny", 1, 2, 1),
    ("qwen2_tiny", 2, 2, 1),
    ("qwen2_tiny", 1, 2, 2),
    ("qwen2_tiny", 2, 2, 4),
    ("llama_tiny_tied", 2, 2, 1),
    ("llama_tiny_tied", 1, 1, 1),
    ("qwen3_tiny", 2, 2, 1),
    ("llama31_tiny_scaled", 1, 1, 1),  # RoPE scaling (llama3) past the original context
    ("llama31_tiny_scaled", 2, 2, 1),
]
TRAIN_CASES = [(2, 1), (2, 2)]  # DP2 and DP1 with 4 processes
# Qwen3-MoE (tests/helpers/specs.py QWEN3_MOE_TINY) over 4 processes: (TP, PP, EP, ETP), EP x ETP
# dividing TP x DP. TP stays 1 here: megatron-core's MoE layer trains at TP > 1 only with sequence
# parallelism, which the local spec's torch norms refuse (tests/gpu covers TP2 x EP2 with TE).
MOE_LOGPROB_CASES = [(1, 1, 1, 1), (1, 1, 2, 1), (1, 1, 4, 1), (1, 1, 1, 2), (1, 1, 2, 2), (1, 2, 2, 1)]
MOE_TRAIN_CASES = [(1, 1, 2, 1), (1, 1, 2, 2)]
OPTIM = dict(
    lr=1e-2, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-3, clip_grad=0.5, distributed_optimizer=True
)
TEMPERATURE = 0.8


def batch():
    """Four sequences of different lengths (right padding and masks matter), fixed prompt lengths."""
    g = torch.Generator().manual_seed(0)
    lengths, prompt_lens = [9, 14, 5, 12], [3, 4, 2, 5]
    seqs = [torch.randint(0, 100, (n,), generator=g).tolist() for n in lengths]
    return seqs, prompt_lens


def advantages(seqs, prompt_lens):
    """A fixed per-token weight so the step is not a plain likelihood step."""
    return [torch.linspace(-1.0, 1.5, len(s) - p) for s, p in zip(seqs, prompt_lens)]


def train_loss(global_tokens: float):
    """-sum(adv * logp) over completion tokens / global token count (the trainer's loss_fn contract)."""

    def loss_fn(lp_BT, mb):
        return -(lp_BT * mb.extras["adv"] * mb.loss_mask_BT).sum() / global_tokens, {}

    return loss_fn


def moe_case_name(tp: int, pp: int, ep: int, etp: int) -> str:
    return f"tp{tp}pp{pp}ep{ep}etp{etp}"


def reinit(tp: int, pp: int, ep: int = 1, etp: int = 1, sequence_parallel: bool = False):
    """Re-create megatron's model-parallel groups at another layout in the same processes.

    The last layout's groups are released first. `destroy_model_parallel` only forgets them, and every
    gloo group keeps a device with three threads while anything holds it: the last layout's models do
    (through their modules), `models/megatron.py global_param_name`'s unbounded cache holds every model
    it has named, and the device guard's registry every gloo group. Without this, by the 22nd layout
    each process ran ~1,300 such threads and spent ~0.4 of a CPU on them (measured idle), slowing every
    later collective on 2 cores; with it, ~370 (a few threads per layout still outlive their groups)."""
    import gc

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from megatron_rl.models.megatron import global_param_name
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.trainer import device_guard
    from megatron_rl.trainer.parallel import init_parallel, launched_world

    ps.destroy_model_parallel()
    global_param_name.cache_clear()
    world = dist.group.WORLD
    for group in [g for g in list(dist.distributed_c10d._world.pg_map) if g is not world]:
        dist.destroy_process_group(group)
        device_guard._CPU_GROUPS.pop(id(group), None)  # its registry of gloo groups would keep this one
    gc.collect()
    layout = ParallelLayout.over(
        launched_world(), tp, pp, ep=ep, etp=etp, sequence_parallel=sequence_parallel
    )
    return init_parallel(layout)


# Value models (trainer/value.py) from random one-label *ForSequenceClassification checkpoints
# (CKPT_ROOT/reward_<spec name>): (spec, TP, PP, sequence parallelism). The tied spec has no lm_head to
# lean on: the value model must load without one, at PP2 too (where a policy's last stage keeps a copy).
# Grouped by layout: the worker builds each layout's process groups once.
VALUE_CASES = [
    ("qwen2_tiny", 1, 1, False),
    ("llama_tiny_tied", 1, 1, False),
    ("qwen2_tiny", 2, 1, False),
    ("qwen2_tiny", 2, 1, True),
    ("qwen2_tiny", 1, 2, False),
    ("qwen2_tiny", 2, 2, False),
    ("llama_tiny_tied", 2, 2, False),
]
# One value-model optimizer step, right after those cases' scores and values: TP2 x DP2, the same with
# sequence parallelism, TP2 x PP2 (DP1).
VALUE_TRAIN_SPEC = "qwen2_tiny"
VALUE_TRAIN_CASES = [(2, 1, False), (2, 1, True), (2, 2, False)]


def reward_checkpoint(spec_name: str) -> str:
    return f"reward_{spec_name}"


# The same value models at a layout of their own (trainer/model_groups.py: PPO's critic at critic.tp/pp),
# built from explicit process groups while megatron-core's global groups stay at TP1 x DP4 (the trainer's).
# They must give what the global groups give at the same TP x PP, against the same references.
OWN_VALUE_CASES = [
    ("qwen2_tiny", 2, 1, False),
    ("qwen2_tiny", 2, 1, True),
    ("qwen2_tiny", 1, 2, False),
    ("qwen2_tiny", 2, 2, False),
]


def value_case_name(spec_name: str, tp: int, pp: int, sp: bool, own: bool = False) -> str:
    return f"{spec_name}_tp{tp}pp{pp}" + ("sp" if sp else "") + ("_own" if own else "")


def value_targets(seqs, prompt_lens):
    """Fixed per-token regression targets for the value step."""
    return [torch.linspace(1.0, -0.5, len(s) - p) for s, p in zip(seqs, prompt_lens)]


def value_loss(global_tokens: float):
    """sum((value - target)^2) over completion tokens / global token count (a critic's regression)."""

    def loss_fn(values_BT, mb):
        return (((values_BT - mb.extras["target"]) ** 2) * mb.loss_mask_BT).sum() / global_tokens, {}

    return loss_fn
