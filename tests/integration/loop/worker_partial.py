"""Partial rollouts through the real collect loop, one vLLM CPU engine in this process (test_partial.py).

    python worker_partial.py OUT_JSON MODEL_DIR

Six batches, each sampled under a new version (different weights), with rollout.partial: the
long-tailed synthetic task (half the prompts may run to 16 tokens, the others stop at 2; no stop id),
4 prompts of 2 samples trained per batch out of 8 in flight. Between batches the carry goes through
its checkpoint form (JSON records and back), as a resume would take it. Written out: every prompt
drawn, every sample trained, the carry after every batch, and, for every trained token, the log-prob
HF transformers gives it under the version the sample says drew it and under the others.
"""

import json
import sys
from dataclasses import asdict, replace

import torch

from megatron_rl.config.load import load_recipe
from megatron_rl.data.synthetic import ArithmeticTask
from megatron_rl.loop.step.carry import carry_from_record, carry_record
from megatron_rl.loop.step.collect import collect_batch
from megatron_rl.reward.pool import RewardPool
from megatron_rl.rollout.vllm_engine import VLLMEngine
from megatron_rl.telemetry.phases import PhaseTimer
from tests.integration.rollout.cases import SPEC, peaky_hf_state, rollout_cfg

OUT, MODEL_DIR = sys.argv[1], sys.argv[2]
BATCHES, LONG, SHORT = 6, 16, 2


def hf(version: int):
    from megatron_rl.models.tiny import hf_model

    m = hf_model(SPEC)
    m.load_state_dict(peaky_hf_state(version), strict=True)
    return m.eval()


def token_logprobs(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)], -1)
    return lp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


class RecordingTask(ArithmeticTask):
    """The synthetic task, noting every prompt it draws. Targets up to 1e9 make every prompt's token ids
    unique, so a trained group can be traced to its draw."""

    def __init__(self):
        super().__init__(seed=0, max_target=10**9, tail_share=0.5, short_answer_tokens=SHORT)
        self.drawn_ids: list[list[list[int]]] = []

    def draw(self, n):
        out = super().draw(n)
        self.drawn_ids.append([p.prompt_ids for p in out])
        return out


def main():
    overrides = [
        "rollout.partial=true",
        "rollout.oversample=2",
        "rollout.partial_max_cuts=2",
        "rollout.samples_per_prompt=2",
        "data.prompts_per_step=4",
        f"rollout.max_new_tokens={LONG}",
        "rollout.stop_token_ids=[]",
    ]
    cfg = load_recipe("grpo_tiny_cpu", overrides)
    cfg = replace(cfg, layout=replace(cfg.layout, engine_count=1))
    engine = VLLMEngine(rollout_cfg(max_new_tokens=LONG, stop_token_ids=[]), MODEL_DIR, tp=1, seed=0)
    task, pool, timer = RecordingTask(), RewardPool(cfg.reward), PhaseTimer()
    carry, out = [], {"batches": [], "max_cuts": 2}
    try:
        for step in range(BATCHES):
            version = step + 1
            engine.update_weights(peaky_hf_state(version).items(), version=version)
            samples, stats, _, _ = collect_batch(cfg, engine, 0, True, task, pool, timer, step, carry=carry)
            records = carry_record(carry, task)
            restored = carry_from_record(json.loads(json.dumps(records)), task)
            assert restored == carry, "the carry changed through its checkpoint records"
            carry[:] = restored
            out["batches"].append(
                {
                    "version": version,
                    "drawn": task.drawn_ids[-1],
                    "trained": [asdict(s) for s in samples],
                    "carry": records,
                    "continued": stats.continued_samples,
                    "cut": stats.cut_samples,
                }
            )
            timer.take()
    finally:
        pool.close()
    models = {v: hf(v) for v in range(1, BATCHES + 1)}
    checks = []
    for b in out["batches"]:
        for s in b["trained"]:
            versions = s["token_versions"] or [s["version"]] * len(s["token_ids"])
            ref = {v: token_logprobs(m, s["prompt_ids"], s["token_ids"]) for v, m in models.items()}
            for i, (lp, v) in enumerate(zip(s["logprobs"], versions)):
                own = abs(lp - ref[v][i])
                other = min(abs(lp - ref[w][i]) for w in models if w != v)
                checks.append({"version": v, "own": own, "other": other})
    out["token_checks"] = checks
    json.dump(out, open(OUT, "w"))


if __name__ == "__main__":
    main()
