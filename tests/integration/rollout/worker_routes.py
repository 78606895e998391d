"""A vLLM CPU engine with routes recorded samples from a Qwen3-MoE fixture; transformers' router picks
the same experts at every fed position (run by test_routing_replay.py).

    python worker_routes.py OUT_JSON FIXTURE_DIR
"""

import json
import sys
from pathlib import Path

import torch

from megatron_rl.rollout.vllm_engine import VLLMEngine
from tests.integration.rollout.cases import rollout_cfg

OUT, FIXTURE = sys.argv[1], Path(sys.argv[2])


def main():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    k = model.config.num_experts_per_tok
    cfg = rollout_cfg(max_new_tokens=12, temperature=1.0, logprobs_mode="raw_logprobs")
    eng = VLLMEngine(
        cfg, FIXTURE, tp=1, seed=0, load_format="auto", dtype="float32", max_model_len=256, record_routes=True
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 600, (n,), generator=g).tolist() for n in (20, 9)]
    samples = eng.generate(prompts, 3)
    agree = pairs = 0
    shapes_ok = True
    for s in samples:
        seq = s.prompt_ids + s.token_ids
        shapes_ok &= tuple(s.routes.shape) == (len(seq) - 1, model.config.num_hidden_layers, k)
        with torch.no_grad():
            logits = model(torch.tensor([seq]), output_router_logits=True).router_logits
        for layer, lg in enumerate(logits):
            want = lg[: len(seq) - 1].float().topk(k, -1).indices.sort(-1).values
            got = s.routes[:, layer].long().sort(-1).values
            agree += int((want == got).all(-1).sum())
            pairs += want.shape[0]
    Path(OUT).write_text(json.dumps({"agree": agree, "pairs": pairs, "shapes_ok": bool(shapes_ok)}))


if __name__ == "__main__":
    main()
