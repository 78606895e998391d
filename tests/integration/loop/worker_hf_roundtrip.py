"""Greedy decoding of the exported policy: transformers and a vLLM CPU engine on the same HF folder
(run by test_hf_path.py).

    python worker_hf_roundtrip.py OUT_JSON EXPORT_DIR

The export carries the tokenizer, chat template and generation config of the checkpoint the run
started from; the prompt is a bundled problem through that chat template.
"""

import json
import sys
from pathlib import Path

import torch

from megatron_rl.models.checkpoint import stop_token_ids
from megatron_rl.rollout.vllm_engine import VLLMEngine
from tests.helpers.greedy import chat_prompt, greedy
from tests.integration.rollout.cases import rollout_cfg

OUT, EXPORT = sys.argv[1], Path(sys.argv[2])
NEW = 24


def main():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(EXPORT)
    prompt = chat_prompt(tok, "Write a Python function `add(a, b)` that returns a + b.")
    stops = stop_token_ids(EXPORT)
    model = AutoModelForCausalLM.from_pretrained(EXPORT, dtype=torch.float32).eval()
    hf = greedy(model, prompt, NEW, stops)
    eng = VLLMEngine(
        rollout_cfg(max_new_tokens=NEW, temperature=0.0), EXPORT, tp=1, seed=0, load_format="auto",
        checkpoint_stop_ids=stops,
    )  # fmt: skip
    got = eng.generate([prompt], 1)[0]
    Path(OUT).write_text(
        json.dumps({"hf": hf, "engine": got.token_ids, "reason": got.finish_reason, "stops": stops})
    )


if __name__ == "__main__":
    main()
