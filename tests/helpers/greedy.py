"""transformers as the oracle of an engine's tokens: a chat prompt, and greedy decoding by argmax."""

from __future__ import annotations

import torch


def chat_prompt(tok, text: str) -> list[int]:
    """`text` as one user turn through the tokenizer's chat template, ready for the assistant."""
    return list(
        tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def greedy(model, prompt: list[int], new: int, stops=()) -> list[int]:
    """Up to `new` argmax tokens after `prompt`, ending after the first of `stops`."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] in stops:
                break
    return ids[len(prompt) :]
