"""One step's phases on a layout: the serial cycle, and the overlapped steady state.

Serial (colocated, or separated and synchronous): every phase waits for the one before:
    [switch] + generation + exposed scoring + old/ref log-probs + train + optimizer + publish
except that the batch comes when generation ends (loop/step/collect.py PendingRewards): the switch and
the forwards that need no reward (reference and old log-probs, a reward model's scores, a critic's
values) run while the pool finishes, and only the scoring they do not cover is exposed. Dynamic
sampling, partial rollouts and multi-turn wait for their rewards first (`Workload.defer_scoring`).
Overlapped (separated, one-step asynchronous): step t+1 is collected while step t is learned, so the
step takes the larger of the two paths:
    collection = publish + generation + exposed scoring           (engine GPUs and the CPU pool)
    learning   = publish + log-prob forwards + train + optimizer  (trainer GPUs)
The publication is on both paths: the engines take part in it (receive, stage, validate, activate)
between two of their batches, so neither pool works during it (parallel/schedule.py).

Compute phases run at the assumed MFU on the trainer GPUs, stretched by two layout effects the MFU
cannot know: DP imbalance (a minibatch's sequences split unevenly over DP ranks: ceil(B/DP)·DP/B)
and the 1F1B pipeline bubble ((PP-1)/microbatches); pipeline sends between stages are added
unoverlapped (a pessimistic bound, small next to the compute). The optimizer phase is the DP gradient
reduce-scatter and parameter all-gather (all-reduce without the distributed optimizer) per
minibatch, over NVLink when the DP group fits in a node, else the GPU's share of the node's IB (a
mixture of experts reduces its experts' gradients over expert-DP instead). With expert parallelism
the token all-to-all of every MoE layer (plan/alltoall.py) adds to training and log-prob forwards, and
per-expert GEMMs (no transformer-engine: a CPU cluster; models/experts.py) their launch-bound overhead
per local expert (`per_expert_seconds`); grouped GEMMs are inside the MFU.
Colocated GPUs also pay a switch each step: the trainer offloads grads and optimizer state to the
host while the engine runs, and a level-1 sleeping engine offloads its weights while the trainer runs.

Training runs algorithm.epochs passes over the minibatches: train_fwd_bwd and optimizer (one
optimizer step per minibatch and pass) scale with it. PPO and a learned reward model add phases on
the trainer GPUs, each at its own model's FLOPs (plan/flops.py) and the same layout effects:
    reward_model   the reward model's forward over every sequence, plus bringing its weights from the
                   host (it lives there between uses)
    critic_values  the critic's forward over every sample (the old values for GAE)
    critic_train   the critic's forward and backward over every minibatch of every pass and its own
                   optimizer step after each (its DP reduce; the loop times them as one phase)
and the colocated switch moves the critic's grads and optimizer state too (its weights stay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from megatron_rl.models.experts import PER_EXPERT
from megatron_rl.parallel.layout import RECOMPUTE_MODES, ParallelLayout
from megatron_rl.plan.alltoall import step_alltoall
from megatron_rl.plan.flops import (
    critic_flops,
    logprob_forward_flops,
    recompute_extra_flops,
    reward_model_flops,
    train_flops,
)
from megatron_rl.plan.generation import Generation, generation
from megatron_rl.plan.inputs import PER_EXPERT_FORWARD_S, PlanInputs
from megatron_rl.plan.memory import GRAD_BYTES, memory_fit, stage_params, stage_params_per_gpu
from megatron_rl.plan.models import LM, SCORE, VALUE, critic_layout, critic_view, reward_view
from megatron_rl.plan.publication import publication
from megatron_rl.plan.scoring import scoring

# The step phases, in the loop's order and with the names its step records use.
PHASES = (
    "generation",
    "scoring",
    "reward_model",
    "old_logprobs",
    "ref_logprobs",
    "critic_values",
    "train_fwd_bwd",
    "optimizer",
    "critic_train",
    "publish",
)
COLLECTION = ("generation", "scoring", "publish")
# On the trainer GPUs: every forward, backward and optimizer step (the reward model's and the critic's too).
LEARNING = (
    "reward_model",
    "old_logprobs",
    "ref_logprobs",
    "critic_values",
    "train_fwd_bwd",
    "optimizer",
    "critic_train",
    "publish",
    "other",
)


@dataclass(frozen=True)
class Cycle:
    layout: ParallelLayout
    phases: dict  # wall seconds per phase (scoring = the part exposed after generation); + "switch"
    gen: Generation
    scoring: dict
    publication: dict
    memory: dict
    serial_s: float
    collection_s: float
    learning_s: float
    overlapped_s: float  # max(collection, learning): the step if the pools were separated and async

    @property
    def step_s(self) -> float:
        """The step this layout actually runs: overlapped only when separated and asynchronous."""
        return self.overlapped_s if self.layout.overlapped else self.serial_s

    def pipelined(self) -> Cycle:
        """The same pools one step asynchronous: the same phases, except that the engines wait for every
        reward before they send a batch (nothing of the scoring hides behind the trainer's forwards)."""
        covered = self.scoring.get("behind_forwards_s", 0.0)
        phases = {**self.phases, "scoring": self.phases["scoring"] + covered}
        sc = {
            **self.scoring,
            "exposed_s": phases["scoring"],
            "hidden_s": self.scoring["hidden_s"] - covered,
            "behind_forwards_s": 0.0,
        }
        layout = self.layout.with_(synchrony="async")
        return replace(self, layout=layout, phases=phases, scoring=sc, serial_s=sum(phases.values()))

    @property
    def gpu_seconds(self) -> float:
        return self.layout.gpus * self.step_s

    @property
    def fits(self) -> bool:
        return self.memory["fits"]

    @property
    def reasons(self) -> list:
        return list(dict.fromkeys(self.memory["reasons"] + list(self.gen.reasons)))


def _rank_microbatches(inp: PlanInputs, layout: ParallelLayout, sequences: int) -> int:
    """Microbatches one DP rank runs for a pass over `sequences` sequences."""
    return math.ceil(math.ceil(sequences / layout.dp) / inp.work.micro_batch_size)


def _stretch(inp: PlanInputs, layout: ParallelLayout, sequences: int) -> float:
    """DP imbalance x pipeline bubble for a pass over `sequences` sequences."""
    dp = layout.dp
    imbalance = math.ceil(sequences / dp) * dp / sequences
    bubble = (layout.pp - 1) / _rank_microbatches(inp, layout, sequences)
    return imbalance * (1.0 + bubble)


def _pp_p2p_seconds(inp: PlanInputs, layout: ParallelLayout, sequences: int, passes: int) -> float:
    """Pipeline sends of one rank over `sequences` sequences: each microbatch crosses each stage
    boundary once per pass (forward, and backward when training), [S/TP, b, h] with sequence
    parallelism. Stages sit tp x cp x dp ranks apart: another node once that exceeds a node."""
    if layout.pp == 1:
        return 0.0
    w, hw = inp.work, inp.hw
    microbatches = _rank_microbatches(inp, layout, sequences)
    tokens = w.micro_batch_size * w.sequence_tokens / layout.cp
    nbytes = (
        tokens * inp.spec.hidden_size * inp.spec.dtype_bytes / (layout.tp if layout.sequence_parallel else 1)
    )
    apart = layout.tp * layout.cp * layout.dp
    link = hw.nvlink_bytes_per_s if apart < hw.gpus_per_node else hw.gpu_ib_bytes_per_s
    return microbatches * passes * nbytes / link


def _tp_collective_seconds(inp: PlanInputs, layout: ParallelLayout, sequences: int, backward: bool) -> float:
    """Latency of one rank's tensor-parallel collectives over `sequences` sequences (one pass).

    Per microbatch and layer of the rank's stage: the forward all-reduces its attention and MLP outputs
    (2 collectives; 4 with sequence parallelism, an all-gather and a reduce-scatter each); the backward
    does the same for their input gradients and, with sequence parallelism, all-gathers the two inputs
    again for the weight gradients (2; 6 with SP), and with full recompute runs the forward's again.
    The vocab-parallel embedding (first stage) and cross-entropy (last stage) add 1 and 3 small ones
    forward, 1 backward. Only their latency is charged: the bytes they move are inside the assumed
    MFU (measured MFUs of TP layouts include their communication). Latency is what decides small models:
    on CPU (gloo, ~1 ms per collective) TP loses to DP long before bandwidth matters."""
    if layout.tp == 1:
        return 0.0
    s = inp.spec
    microbatches = _rank_microbatches(inp, layout, sequences)
    layers = math.ceil(s.num_layers / layout.pp)
    sp = layout.sequence_parallel
    per_layer = 4 if sp else 2
    small = (1 if layout.pp == 1 else 0) + 3  # embedding on the first stage, cross-entropy on the last
    if backward:
        per_layer += 6 if sp else 2
        per_layer += (4 if sp else 2) if layout.recompute == "full" else 0
        small += 1
    return microbatches * (layers * per_layer + small) * inp.hw.allreduce_latency_s


def per_expert_seconds(inp: PlanInputs, layout: ParallelLayout, sequences: int, backward: bool) -> float:
    """Per-expert GEMMs' overhead of one rank's pass over `sequences` sequences (0 with grouped GEMMs or a
    dense model): every microbatch runs each of the rank's local experts in each MoE layer of its stage
    (PER_EXPERT_FORWARD_S a forward; backward twice that, and full recompute a second forward)."""
    s = inp.spec
    if not s.is_moe or inp.assume.expert_gemm != PER_EXPERT:
        return 0.0
    forwards = 1 + (2 + (1 if layout.recompute == "full" else 0) if backward else 0)
    calls = _rank_microbatches(inp, layout, sequences) * math.ceil(s.num_layers / layout.pp)
    return calls * math.ceil(s.num_experts / layout.ep) * forwards * PER_EXPERT_FORWARD_S


def _pass_comm(inp: PlanInputs, layout: ParallelLayout, sequences: int, backward: bool) -> float:
    """One rank's pipeline sends, TP collective latency and per-expert overhead of a pass over `sequences`."""
    out = _pp_p2p_seconds(inp, layout, sequences, passes=2 if backward else 1)
    out += _tp_collective_seconds(inp, layout, sequences, backward=backward)
    out += per_expert_seconds(inp, layout, sequences, backward=backward)
    return out


def optimizer_step_seconds(inp: PlanInputs, layout: ParallelLayout, head: str = LM) -> float:
    """One optimizer step's DP gradient reduce-scatter and parameter all-gather (all-reduce without the
    distributed optimizer) of the model of `inp.spec` with `head`, per GPU of its heaviest stage."""
    hw, s = inp.hw, inp.spec
    ranks_per_group_span = layout.tp * layout.cp * layout.dp
    link = hw.nvlink_bytes_per_s if ranks_per_group_span <= hw.gpus_per_node else hw.gpu_ib_bytes_per_s
    if inp.assume.distributed_optimizer:  # reduce-scatter fp32 grads + all-gather updated params
        per_byte = GRAD_BYTES + s.dtype_bytes
    else:  # all-reduce of fp32 grads
        per_byte = 2 * GRAD_BYTES
    if s.is_moe:  # dense grads reduce over DP x CP, the experts' over expert-DP (the same span of ranks)
        dense_gpu, expert_gpu = max(stage_params_per_gpu(inp, layout, head), key=sum)
        group, egroup = layout.dp * layout.cp, max(1, layout.expert_dp)
        return (dense_gpu * (group - 1) / group + expert_gpu * (egroup - 1) / egroup) * per_byte / link
    params_gpu = max(stage_params(inp, layout, head)) / layout.tp
    group = layout.dp * layout.cp
    return params_gpu * per_byte * (group - 1) / group / link


def trainer_phases(inp: PlanInputs, layout: ParallelLayout) -> dict:
    """Wall seconds of the trainer's phases on `layout.trainer_gpus` GPUs."""
    w, hw, s = inp.work, inp.hw, inp.spec
    rate = layout.trainer_gpus * hw.peak_flops * inp.assume.train_mfu
    per_minibatch = max(1, w.samples // w.minibatches)
    steps = w.epochs * w.minibatches  # optimizer steps of each trained model
    lp = logprob_forward_flops(inp)
    fwd_stretch = _stretch(inp, layout, w.samples)
    fwd_comm = _pass_comm(inp, layout, w.samples, backward=False)
    train_comm = _pass_comm(inp, layout, per_minibatch, backward=True)
    train = train_flops(inp) + recompute_extra_flops(inp, layout.recompute)
    out = {}
    if inp.reward_model is not None:  # its forward, after bringing its weights (TP x PP shard) from the host
        r = reward_view(inp)
        upload = (
            max(stage_params(r, layout, SCORE)) / layout.tp * r.spec.dtype_bytes / hw.host_link_bytes_per_s
        )
        out["reward_model"] = (
            reward_model_flops(inp) / rate * _stretch(r, layout, w.samples)
            + _pass_comm(r, layout, w.samples, backward=False)
            + upload
        )
    out |= {
        "old_logprobs": (lp["old"] / rate * fwd_stretch + fwd_comm) if lp["old"] else 0.0,
        "ref_logprobs": (lp["ref"] / rate * fwd_stretch + fwd_comm) if lp["ref"] else 0.0,
    }
    if inp.critic is not None:
        c = critic_view(inp)
        c_layout = critic_layout(inp, layout)  # the trainer's, or critic.tp/pp's own
        cf = critic_flops(inp, c_layout.recompute)
        out["critic_values"] = cf["values"] / rate * _stretch(c, c_layout, w.samples) + _pass_comm(
            c, c_layout, w.samples, backward=False
        )
    out["train_fwd_bwd"] = train / rate * _stretch(inp, layout, per_minibatch) + steps * train_comm
    out["optimizer"] = steps * optimizer_step_seconds(inp, layout)
    if inp.critic is not None:
        critic_step = _pass_comm(c, c_layout, per_minibatch, backward=True) + optimizer_step_seconds(
            c, c_layout, VALUE
        )
        critic_compute = (cf["train"] + cf["recompute_extra"]) / rate * _stretch(c, c_layout, per_minibatch)
        out["critic_train"] = critic_compute + w.critic_epochs * w.minibatches * critic_step
    side_moe = any(m is not None and m.is_moe for m in (inp.reward_model, inp.critic and inp.critic.spec))
    if s.is_moe or side_moe:  # expert parallelism's token all-to-all (plan/alltoall.py), outside the MFU
        for phase, a2a in step_alltoall(inp, layout)["phases"].items():
            if out.get(phase):
                out[phase] += a2a["seconds"]
    return out


def switch_seconds(inp: PlanInputs, layout: ParallelLayout, memory: dict) -> float:
    """Colocated only: host offload and reload of what each side does not need while the other runs
    (with PPO the critic's grads and optimizer state too; its weights, like the policy's, stay)."""
    if not layout.colocated:
        return 0.0
    tr = memory["trainer"]
    moved = 2 * (tr["grads"] + tr["optimizer"])
    if tr.get("critic"):
        critic = memory["trainer"]["by_model"]["critic"]
        moved += 2 * (critic["grads"] + critic["optimizer"])
    if inp.assume.sleep_level == 1:
        moved += 2 * memory["engine"]["weights"]
    return moved / inp.hw.host_link_bytes_per_s


# What runs between generation's end and the wait for the last reward, when scoring is deferred.
NEED_NO_REWARD = ("switch", "reward_model", "old_logprobs", "ref_logprobs", "critic_values")


def cycle(inp: PlanInputs, layout: ParallelLayout) -> Cycle:
    gen = generation(inp, layout)
    sc = scoring(inp, gen)
    pub = publication(inp, layout)
    mem = memory_fit(inp, layout)
    phases = {"generation": gen.wall_s, "scoring": sc["exposed_s"]}
    phases.update(trainer_phases(inp, layout))
    phases["publish"] = pub["total_s"]
    if layout.colocated:
        phases["switch"] = switch_seconds(inp, layout, mem)
    out = from_phases(layout, phases, gen, sc, pub, mem)
    if not inp.work.defer_scoring or layout.overlapped:
        return out
    # the serial cycle's scoring is what the forwards leave; the collection path (the same layout run
    # asynchronously, which waits for every reward before it sends the batch) keeps it all
    covered = min(phases["scoring"], sum(phases.get(p, 0.0) for p in NEED_NO_REWARD))
    serial = {**phases, "scoring": phases["scoring"] - covered}
    sc = {
        **sc,
        "exposed_s": serial["scoring"],
        "hidden_s": sc["hidden_s"] + covered,
        "behind_forwards_s": covered,
    }
    return replace(out, phases=serial, scoring=sc, serial_s=sum(serial.values()))


def from_phases(layout: ParallelLayout, phases: dict, gen, sc, pub, mem) -> Cycle:
    """Serial and overlapped cycles from phase times (predicted, or measured by --from-steps)."""
    collection = sum(phases.get(p, 0.0) for p in COLLECTION)
    learning = sum(phases.get(p, 0.0) for p in LEARNING)
    return Cycle(
        layout=layout,
        phases=dict(phases),
        gen=gen,
        scoring=sc,
        publication=pub,
        memory=mem,
        serial_s=sum(phases.values()),
        collection_s=collection,
        learning_s=learning,
        overlapped_s=max(collection, learning),
    )


def lightest_fitting(inp: PlanInputs, layout: ParallelLayout) -> ParallelLayout:
    """The layout with the cheapest recompute that fits in memory (the heaviest if none does)."""
    for mode in RECOMPUTE_MODES:
        trial = layout.with_(recompute=mode)
        if memory_fit(inp, trial)["fits"]:
            return trial
    return layout.with_(recompute="full")


def split_options(total_gpus: int, gpus_per_node: int) -> list[int]:
    """Engine-pool sizes to try when separating: whole nodes, at most the seven eighths."""
    gran = gpus_per_node if total_gpus > gpus_per_node else 1
    every = list(range(gran, total_gpus - gran + 1, gran))
    if len(every) <= 15:
        return every
    picks = {max(gran, min(total_gpus - gran, round(total_gpus * k / 8 / gran) * gran)) for k in range(1, 8)}
    return sorted(picks)
