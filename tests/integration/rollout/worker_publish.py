"""Trainer TP2 publishing into two colocated TP1 vLLM CPU engines, twice (run by test_publish_tp2.py).

    torchrun --nproc-per-node 2 worker_publish.py OUT_DIR MODEL_DIR

Both ranks hold a TP shard of the trainer and one TP1 engine (engine k = rank k, started from
config.json alone with dummy weights). Version 1 is the random-init policy (lm_head scaled 20x, so
next-token distributions are peaked); version 2 follows one real optimizer step. After each
publication both engines generate (a 150-token prompt, longer than one 128-token KV block, and a
short one, n=2 each), the samples of both engines are gathered, and the trainer scores all of them
teacher-forced: the log-prob check of rollout/logprob_check.py, gathered as tools/check_logprobs.py does. Rank 0 writes the results.
"""

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.loop.placement.probe import Prober, probe_sequences
from megatron_rl.loop.placement.publication import RefusalPolicy
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.faults import FaultInjector
from megatron_rl.reshard.publish import Publisher
from megatron_rl.rollout.agreement import thresholds_for
from megatron_rl.rollout.logprob_check import bind_trainer_logprobs, check_samples
from megatron_rl.rollout.sink import VLLMEngineSink
from megatron_rl.rollout.types import SamplingSettings
from megatron_rl.rollout.vllm_engine import VLLMEngine
from megatron_rl.trainer.parallel import init_parallel, launched_world
from megatron_rl.trainer.policy import OptimSettings, Policy
from tests.integration.rollout.cases import LONG_PROMPT, SPEC, rollout_cfg
from tools.check_logprobs import gather_engine_samples

OUT, MODEL_DIR = Path(sys.argv[1]), sys.argv[2]
SAMPLED = SamplingSettings(temperature=1.0, max_new_tokens=16)
GREEDY = SamplingSettings(temperature=0.0, max_new_tokens=8)
THRESHOLD = 1e-3


def sft_loss(global_tokens: float):
    """-sum log p(completion) / tokens: a real gradient that moves the policy toward its samples."""

    def fn(logprobs_BT, mb):
        mask = mb.loss_mask_BT.to(logprobs_BT.device)
        return -(logprobs_BT * mask).sum() / global_tokens, {}

    return fn


def round_of(policy, engine, pub, step, cfg):
    t = time.perf_counter()
    res = pub.publish(policy.named_parameters_global(), step=step)
    publish_s = time.perf_counter() - t
    rank = dist.get_rank()
    prompts = [LONG_PROMPT, [1 + rank, 2, 3, 4]]
    samples = gather_engine_samples(engine, prompts, 2, SAMPLED, policy.state.cpu_group)
    stats = dict(engine.last_stream)
    greedy = gather_engine_samples(engine, [LONG_PROMPT], 1, GREEDY, policy.state.cpu_group)
    lp_fn = bind_trainer_logprobs(policy.logprobs, cfg.logprobs_mode, SAMPLED)
    report = check_samples(samples, lp_fn, THRESHOLD)
    greedy_report = check_samples(
        greedy, bind_trainer_logprobs(policy.logprobs, cfg.logprobs_mode, GREEDY), THRESHOLD
    )
    return samples, dict(
        activated=res.activated,
        problems=res.problems,
        version=res.version,
        publish_s=publish_s,
        publish_seconds=res.seconds,
        report=report,
        greedy_report=greedy_report,
        greedy_tokens=[g.token_ids for g in greedy],
        versions=sorted({s.version for s in samples + greedy}),
        engines_differ=samples[0].token_ids != samples[4].token_ids,  # same long prompt, engine 0 vs 1
        stream=stats,
    )


def faulty_round(policy, engine, pub, layout):
    """Version 3: version 2's weights through a conversion fault; refused by the probe, rolled back."""
    thresholds = thresholds_for("fp32", "fp32")
    rank = dist.get_rank()
    prober = Prober(
        probe_sequences(SPEC.vocab_size, 4, 32, seed=0),
        thresholds,
        policy.state.cpu_group,
        engine=engine,
        engine_index=rank,
        is_leader=True,
        policy=policy,
    )
    guard = RefusalPolicy(pub, "skip", 3, "refuse", thresholds)
    faults = FaultInjector({3: "gate_up"}, SPEC, tp=2)
    named = faults.wrap(policy.named_parameters_global, lambda: pub.next_version)
    res = guard.publish(named, 2, prober)
    greedy = gather_engine_samples(engine, [LONG_PROMPT], 1, GREEDY, policy.state.cpu_group)
    again = prober(engine.version)  # the version served after the roll-back, against the same trainer
    return dict(
        activated=res.activated,
        problems=res.problems,
        probe=res.probe,
        action=res.action,
        served=engine.version,
        greedy_tokens=[g.token_ids for g in greedy],
        probe_after=again.record(thresholds),
    )


def main():
    st = init_parallel(ParallelLayout.over(launched_world(), 2, 1))
    rank = st.env.rank
    cfg = rollout_cfg()
    policy = Policy(SPEC, st, optim=OptimSettings(lr=2e-4, clip_grad=0.0))
    with torch.no_grad():
        for name, p in policy.named_parameters_global():
            if name == "output_layer.weight":
                p.mul_(20)
    t = time.perf_counter()
    engine = VLLMEngine(cfg, MODEL_DIR, tp=1, seed=cfg.seed, engine_index=rank)
    start_s = time.perf_counter() - t
    layout = ParallelLayout(tp=2, engine_tp=1, engine_count=2)
    sink = VLLMEngineSink(engine, keep_previous=True)  # what the loop builds when the probe may refuse
    pub = Publisher(layout, SPEC, sink=sink, delivery="loader")

    samples1, r1 = round_of(policy, engine, pub, step=0, cfg=cfg)

    # One optimizer step on the gathered samples (identical on both TP ranks; DP = 1).
    seqs, plens = [s.sequence for s in samples1], [s.prompt_len for s in samples1]
    tokens = float(sum(len(s.token_ids) for s in samples1))
    metrics = policy.train_step(seqs, plens, sft_loss(tokens))
    # The new policy's log-probs on the old samples: how far the step moved the policy.
    moved = check_samples(
        samples1, bind_trainer_logprobs(policy.logprobs, cfg.logprobs_mode, SAMPLED), THRESHOLD
    )

    _, r2 = round_of(policy, engine, pub, step=1, cfg=cfg)
    r3 = faulty_round(policy, engine, pub, layout)
    if rank == 0:
        out = dict(start_s=start_s, round1=r1, round2=r2, round3=r3, moved=moved, train=metrics)
        (OUT / "publish.json").write_text(json.dumps(out, indent=1))
    dist.barrier()


if __name__ == "__main__":
    main()
