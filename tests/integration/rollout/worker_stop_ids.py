"""A vLLM CPU engine on the qwen2 fixture stops at either of the checkpoint's end ids (run by
test_checkpoint_stop_ids.py).

    python worker_stop_ids.py OUT_JSON FIXTURE_DIR

The engine loads the fixture itself (safetensors, with its generation_config.json beside it) and is
told to ignore vLLM's own eos (rollout/vllm_engine.py), so its only stop ids are those handed to it:
without them it must run to the cap, even through `<|im_end|>`, which the fixture's config.json names
as eos. Weights are then the fixture's with a crafted path through the residual stream: attention and
MLP outputs zeroed, so the last hidden state is the current token's embedding; a few tokens get
orthogonal embeddings and `lm_head` maps each to its successor, so greedy decoding walks a fixed chain
that passes through an end id and then keeps going (a 2-cycle).
"""

import json
import sys
from pathlib import Path

from megatron_rl.models.checkpoint import stop_token_ids
from megatron_rl.rollout.types import SamplingSettings
from megatron_rl.rollout.vllm_engine import VLLMEngine
from tests.helpers.greedy import chat_prompt, greedy
from tests.integration.rollout.cases import rollout_cfg

OUT, FIXTURE = sys.argv[1], Path(sys.argv[2])
CAP = 8


def chain(prompt_end: int, end_id: int) -> list[int]:
    """prompt_end -> a -> b -> end_id -> c -> d -> c -> d ...: the end id is the 3rd completion token."""
    a, b, c, d = 20, 21, 22, 23
    return [prompt_end, a, b, end_id, c, d]


def crafted_state(base: dict, steps: list[int]) -> dict:
    sd = {k: v.clone() for k, v in base.items()}
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k].zero_()
    sd["model.norm.weight"].fill_(1.0)
    sd["lm_head.weight"].zero_()
    nxt = dict(zip(steps, steps[1:]))
    nxt[steps[-1]] = steps[-2]  # the 2-cycle after the end id
    for axis, tok in enumerate(dict.fromkeys(steps)):
        sd["model.embed_tokens.weight"][tok].zero_()
        sd["model.embed_tokens.weight"][tok, axis] = 1.0
        sd["lm_head.weight"][nxt[tok], axis] = 1.0  # logit sqrt(hidden) ~ 11 for the successor, 0 elsewhere
    return sd


def hf_greedy(sd: dict, prompt: list[int]) -> list[int]:
    """transformers' greedy tokens on the same weights: the chain is the model's, not the engine's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(FIXTURE).eval()
    model.load_state_dict(sd, strict=True)
    return greedy(model, prompt, CAP)


def main():
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FIXTURE)
    prompt = chat_prompt(tok, "Write a Python function `add(a, b)`.")
    ids = stop_token_ids(FIXTURE)
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    cfg = rollout_cfg(max_new_tokens=CAP, temperature=0.0)
    eng = VLLMEngine(cfg, FIXTURE, tp=1, seed=0, load_format="auto", checkpoint_stop_ids=ids)
    r = {
        "stop_ids": ids,
        "end_ids": {"im_end": im_end, "endoftext": endoftext},
        "engine_stop_ids": eng.sampling.stop_token_ids,
        "runs": {},
    }
    base = load_file(str(FIXTURE / "model.safetensors"))
    without = SamplingSettings.from_config(cfg)  # the recipe's stop ids alone (none)
    for version, (name, end_id) in enumerate([("im_end", im_end), ("endoftext", endoftext)]):
        steps = chain(prompt[-1], end_id)
        sd = crafted_state(base, steps)
        eng.update_weights(sd.items(), version=version + 1)  # 0: the loaded checkpoint
        with_ids = eng.generate([prompt], 1)[0]
        no_ids = eng.generate([prompt], 1, without)[0]
        r["runs"][name] = {
            "chain": steps[1:],
            "hf_greedy": hf_greedy(sd, prompt),
            "with": {
                "tokens": with_ids.token_ids,
                "reason": with_ids.finish_reason,
                "truncated": with_ids.truncated,
            },
            "without": {
                "tokens": no_ids.token_ids,
                "reason": no_ids.finish_reason,
                "truncated": no_ids.truncated,
            },
        }
    Path(OUT).write_text(json.dumps(r))


if __name__ == "__main__":
    main()
