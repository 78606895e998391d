"""GPU-only rollout checks, one process, one GPU (run by test_gpu.py; skipped without CUDA).

    python worker_gpu.py OUT_JSON MODEL_DIR

1. Sleep really frees device memory and wake-up brings it back in two steps (weights, then KV
   cache); a publication lands between the two; level 2 discards the weights and generation then
   waits for a publication.
2. In-place delivery writes vLLM's own parameters (vLLM names and layout) and takes effect.
   A roll-back in place (a refused log-prob probe) serves the previous version again.
3. Trainer offload: the optimizer state and gradient buffers leave the device and come back, and
   the next optimizer step is the same as without the round trip.
Oracle for log-probs: HF transformers on the same weights.
"""

import json
import sys

import torch

from megatron_rl.loop.placement.timeshare import memory_snapshot, offload_trainer, restore_trainer
from megatron_rl.rollout.types import SamplingSettings
from megatron_rl.rollout.vllm_engine import VLLMEngine
from tests.integration.rollout.cases import SPEC, peaky_hf_state, rollout_cfg

OUT, MODEL_DIR = sys.argv[1], sys.argv[2]
GREEDY = SamplingSettings(temperature=0.0, max_new_tokens=8)
PROMPTS = [[1, 2, 3, 4], [10, 20, 30]]


def hf_diff(sd, samples):
    from megatron_rl.models.tiny import hf_model

    m = hf_model(SPEC)
    m.load_state_dict(sd)
    worst = 0.0
    for x in samples:
        with torch.no_grad():
            lg = m(torch.tensor([x.prompt_ids + x.token_ids])).logits[0].float()
        lp = torch.log_softmax(lg[x.prompt_len - 1 : -1], -1)[
            torch.arange(len(x.token_ids)), torch.tensor(x.token_ids)
        ]
        worst = max(worst, (lp - torch.tensor(x.logprobs)).abs().max().item())
    return worst


def engine_checks(r):
    eng = VLLMEngine(rollout_cfg(gpu_memory_utilization=0.2, enforce_eager=False), MODEL_DIR, tp=1, seed=0)
    sd = peaky_hf_state(0)
    eng.update_weights(sd.items(), version=1)
    r["v1_diff"] = hf_diff(sd, eng.generate(PROMPTS, 1, GREEDY))
    awake = memory_snapshot()["device_used_gib"]
    r["slept"] = eng.sleep()
    asleep = memory_snapshot()["device_used_gib"]
    eng.wake_up(["weights"])
    weights_only = memory_snapshot()["device_used_gib"]
    # In-place delivery: vLLM's own names and layout (here: read back, lm_head doubled).
    params = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
    params["lm_head.weight"] *= 2
    eng.update_weights_inplace(params.items(), version=2)
    eng.wake_up(["kv_cache"])
    r["memory_gib"] = dict(
        awake=awake, asleep=asleep, weights_only=weights_only, woken=memory_snapshot()["device_used_gib"]
    )
    sd2 = dict(sd)
    sd2["lm_head.weight"] = sd["lm_head.weight"] * 2
    samples = eng.generate(PROMPTS, 1, GREEDY)
    r["inplace_diff"] = hf_diff(sd2, samples)
    r["inplace_versions"] = sorted({x.version for x in samples})
    eng.sleep_level = 2
    eng.sleep()
    eng.wake_up()
    try:
        eng.generate(PROMPTS, 1, GREEDY)
        r["level2_refused"] = False
    except RuntimeError:
        r["level2_refused"] = True
    eng.update_weights(sd.items(), version=3)
    r["level2_diff"] = hf_diff(sd, eng.generate(PROMPTS, 1, GREEDY))
    # A refused probe's roll-back, in place: activation swaps, so the staging buffers keep version 3,
    # and restoring them serves version 3 again (rollout/sink.py keep_previous).
    served = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
    staged = {n: t.clone() for n, t in served.items()}
    staged["lm_head.weight"] *= 3
    eng.update_weights_inplace(staged.items(), version=4, keep_previous=True)
    r["swap_kept_previous"] = all(torch.equal(staged[n], served[n]) for n in served)
    eng.restore_weights(staged.items(), 3, inplace=True)
    r["restored_version"] = eng.version
    r["restored_diff"] = hf_diff(sd, eng.generate(PROMPTS, 1, GREEDY))


def trainer_checks(r, st):
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from megatron_rl.trainer.policy import OptimSettings, Policy

    seqs, plens = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], [3, 2]

    def loss(lp_BT, mb):  # the microbatch is on the policy's device (trainer/batch.py): no .to() here
        return -(lp_BT * mb.loss_mask_BT).sum() / 7.0, {}

    finals = []
    for round_trip in (False, True):
        torch.manual_seed(0)
        model_parallel_cuda_manual_seed(0)
        pol = Policy(SPEC, st, optim=OptimSettings(lr=1e-3))
        pol.train_step(seqs, plens, loss)
        if round_trip:
            before = torch.cuda.memory_allocated()
            r["offloaded"] = offload_trainer(pol.optimizer, pol.ddp)
            r["offload_freed_gib"] = (before - torch.cuda.memory_allocated()) / 2**30
            r["restored"] = restore_trainer(pol.optimizer, pol.ddp)
        pol.train_step(seqs, plens, loss)
        finals.append({n: p.detach().clone() for n, p in pol.named_parameters_global()})
    r["offload_step_max_diff"] = max((finals[0][n] - finals[1][n]).abs().max().item() for n in finals[0])


def main():
    from megatron_rl.models.precision import strict_fp32
    from megatron_rl.parallel.layout import ParallelLayout

    strict_fp32()  # fp32 engine vs fp32 HF at 1e-4: no TF32 (cuBLAS, torch, Triton), before CUDA starts
    from megatron_rl.trainer.parallel import init_parallel, launched_world

    st = init_parallel(
        ParallelLayout.over(launched_world(), 1, 1)
    )  # the trainer's process group first, as in the loop; the engine joins it
    r = {}
    engine_checks(r)
    trainer_checks(r, st)
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
