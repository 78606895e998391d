"""A vLLM CPU engine's log-probs against transformers on one released-format fixture, at positions
past the original context of Llama-3.1's RoPE scaling (run by test_fixture_logprobs.py).

    python worker_fixture_logprobs.py OUT_JSON FIXTURE_DIR [reload]

With `reload` the engine starts from dummy weights and receives the checkpoint's tensors as a publication
does (loader delivery: whole fused groups through vLLM's reload), instead of loading the folder.

The engine loads the folder itself (config.json with its rope_scaling, safetensors); it samples at
temperature 1 with raw log-probs from a prompt of 80 tokens, past the llama fixture's 64-position
original context, and transformers scores the same tokens.
"""

import json
import sys
from pathlib import Path

import torch

from megatron_rl.rollout.vllm_engine import VLLMEngine
from tests.integration.rollout.cases import rollout_cfg

OUT, FIXTURE = sys.argv[1], Path(sys.argv[2])
RELOAD = sys.argv[3:] == ["reload"]
PROMPT, NEW = 80, 24


def main():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, min(vocab, 600), (PROMPT,), generator=g).tolist()
    cfg = rollout_cfg(max_new_tokens=NEW, temperature=1.0, logprobs_mode="raw_logprobs")
    load = "dummy" if RELOAD else "auto"
    eng = VLLMEngine(cfg, FIXTURE, tp=1, seed=0, load_format=load, dtype="float32", max_model_len=256)
    if RELOAD:
        from safetensors.torch import load_file

        eng.update_weights(sorted(load_file(str(FIXTURE / "model.safetensors")).items()), version=1)
    samples = eng.generate([prompt], 2)
    worst, positions = 0.0, []
    for s in samples:
        seq = prompt + list(s.token_ids)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
        ref = lp[torch.arange(PROMPT - 1, len(seq) - 1), torch.tensor(s.token_ids)]
        worst = max(worst, float((ref - torch.tensor(s.logprobs)).abs().max()))
        positions.append(len(seq))
    rope = model.config.to_dict().get("rope_parameters") or model.config.to_dict().get("rope_scaling") or {}
    Path(OUT).write_text(
        json.dumps(
            {
                "max_abs_diff": worst,
                "longest": max(positions),
                "rope": rope,
                "tokens": sum(map(len, (s.token_ids for s in samples))),
                "experts_repacked": eng.experts_repacked,
            }
        )
    )


if __name__ == "__main__":
    main()
