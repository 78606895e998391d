"""What an HF checkpoint directory says about generation, read from its JSON files (no tokenizer load).

The rollout engines run without a tokenizer (prompts are token ids), so vLLM never learns where a
completion ends: an instruct model's end of turn must be handed to them as stop ids. Released
checkpoints name it in two places that disagree on purpose: Qwen2.5/Qwen3 instruct set the
tokenizer's eos to `<|im_end|>` while `generation_config.json` lists `[<|im_end|>, <|endoftext|>]`;
Llama-3.1-Instruct lists `[<|end_of_text|>, <|eom_id|>, <|eot_id|>]`. A sample that emits any of them
has ended; missing one lets it run on to the length cap and train on text after its end.
"""

from __future__ import annotations

import json
from pathlib import Path


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _ids(value) -> list[int]:
    """An `eos_token_id` as HF writes it: absent, one int, or a list of ints; anything else (a string,
    a null inside the list) is refused rather than read as something the engines would stop at."""
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return [value]
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return list(value)
    raise ValueError(f"eos_token_id must be a token id or a list of them; got {value!r}")


def _token_text(token) -> str | None:
    """A special token as tokenizer configs write it: a string, or an AddedToken dict with `content`."""
    if isinstance(token, dict):
        return token.get("content")
    return token


def tokenizer_eos_id(hf_dir: str | Path) -> int | None:
    """The id of the tokenizer's eos token (tokenizer_config.json or special_tokens_map.json, looked up
    in tokenizer.json's added tokens, then its vocabulary); None when the directory has no tokenizer."""
    d = Path(hf_dir)
    eos = _token_text(_read(d / "tokenizer_config.json").get("eos_token"))
    eos = eos or _token_text(_read(d / "special_tokens_map.json").get("eos_token"))
    if not eos:
        return None
    tok = _read(d / "tokenizer.json")
    for added in tok.get("added_tokens", []):
        if added.get("content") == eos:
            return int(added["id"])
    vocab = (tok.get("model") or {}).get("vocab") or {}
    return int(vocab[eos]) if isinstance(vocab, dict) and eos in vocab else None


def stop_token_ids(hf_dir: str | Path) -> list[int]:
    """Every id that ends a completion of this checkpoint, sorted: `generation_config.json`'s
    `eos_token_id` (config.json's when there is no generation config, as HF derives one) and the
    tokenizer's eos. Raises FileNotFoundError when `hf_dir` holds no config.json."""
    d = Path(hf_dir)
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{d} holds no config.json (an HF model directory is expected)")
    gen_path = d / "generation_config.json"
    source = _read(gen_path) if gen_path.is_file() else _read(d / "config.json")
    ids = set(_ids(source.get("eos_token_id")))
    eos = tokenizer_eos_id(d)
    if eos is not None:
        ids.add(eos)
    return sorted(ids)
