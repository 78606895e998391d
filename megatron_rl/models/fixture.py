"""Tiny checkpoints in the released format of each family, built here from random weights (no download).

    python -m megatron_rl.models.fixture FAMILY OUT_DIR [--seed N]

A random `config.json` alone exercises the shapes; what breaks on a real checkpoint is everything
around them: two end-of-turn ids (Qwen2.5/Qwen3 instruct stop at `<|im_end|>` *and*
`<|endoftext|>`), special tokens placed after the regular vocabulary, a padded embedding, a chat
template, Llama-3.1's `rope_scaling`. So each fixture holds what the released models hold: weights via
`save_pretrained` (safetensors), `config.json`, `generation_config.json`, and a real byte-level BPE
tokenizer (`tokenizer.json`, `tokenizer_config.json`, the family's chat template) trained with the
`tokenizers` library on the bundled coding problems, so prompts tokenize into sensible pieces.

Families (2 layers, hidden 128, 4 heads of 32, 2 KV heads, FFN 256, 512 positions, fp32; head size 32
is one the vLLM CPU build's attention kernels take):
  qwen2  Qwen2.5-Instruct: QKV bias, ChatML, eos `<|im_end|>`, generation eos [im_end, endoftext],
         vocabulary padded to a multiple of 128 as Qwen pads it;
  qwen3  Qwen3: QK-norm, no QKV bias, tied embeddings (as the small Qwen3s), ChatML with `<think>`;
  llama  Llama-3.1-Instruct: header-token template, eos `<|eot_id|>`, generation eos
         [end_of_text, eom_id, eot_id], exact vocabulary, llama3 `rope_scaling` (factor 8 over 64
         original positions, so a 512-position run reaches the scaled range).

Deterministic for a seed (torch's seed for the weights; BPE training is deterministic). Idempotent: the
fixture is built in a sibling folder and renamed into place, and `fixture.json` (written last) records
its parameters, so a complete folder with the same parameters is reused and a partial one never exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from megatron_rl.data.problems import BUNDLED
from megatron_rl.models.spec import ModelSpec
from megatron_rl.models.tiny import hf_model

MARKER = "fixture.json"
FORMAT = 1  # bump when the files a fixture holds change, so stale fixtures are rebuilt, not reused
FAMILIES = ("qwen2", "qwen3", "llama", "qwen3_moe")

# Pre-tokenizer split patterns of the released tokenizers (Llama-3 groups digits by three).
_QWEN_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# Chat templates in each family's style (the released ones, without the tool-calling branches).
_CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
)
_QWEN2_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}" + _CHATML + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_QWEN3_TEMPLATE = _CHATML + (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)
_LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Llama-3.1's first special tokens, in their order (ids 128000..128010 in the released vocabulary).
_LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]


@dataclass(frozen=True)
class FamilyStyle:
    """What a family's released checkpoint holds around the weights."""

    split: str
    specials: list[str]
    plain_added: list[str]  # added tokens that are not special (Qwen3's <think> tags)
    template: str
    bos: str | None
    eos: str  # the tokenizer's eos (the instruct model's end of turn)
    pad: str
    generation_eos: list[str]  # generation_config.eos_token_id, in the released order
    vocab_multiple: int  # the embedding is padded to a multiple of this (1 = exact)
    tokenizer_class: str
    tie_word_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None


STYLES = {
    "qwen2": FamilyStyle(
        _QWEN_SPLIT, _QWEN_SPECIALS, [], _QWEN2_TEMPLATE, None, "<|im_end|>", "<|endoftext|>",
        ["<|im_end|>", "<|endoftext|>"], 128, "Qwen2Tokenizer", False, 1e-6, 1e6, None,
    ),
    "qwen3": FamilyStyle(
        _QWEN_SPLIT, _QWEN_SPECIALS, ["<think>", "</think>"], _QWEN3_TEMPLATE, None, "<|im_end|>",
        "<|endoftext|>", ["<|im_end|>", "<|endoftext|>"], 128, "Qwen2Tokenizer", True, 1e-6, 1e6, None,
    ),
    "llama": FamilyStyle(
        _LLAMA_SPLIT, _LLAMA_SPECIALS, [], _LLAMA_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>",
        "<|finetune_right_pad_id|>", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], 1,
        "PreTrainedTokenizerFast", False, 1e-5, 500000.0,
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64},
    ),
}  # fmt: skip
# Qwen3-MoE ships Qwen3's tokenizer and chat template, with untied embeddings (as Qwen3-30B-A3B).
STYLES["qwen3_moe"] = replace(STYLES["qwen3"], tie_word_embeddings=False)


@dataclass(frozen=True)
class FixtureSize:
    """The same small shape for every family: what differs between fixtures is the family's format."""

    num_layers: int = 2
    hidden_size: int = 128
    ffn_hidden_size: int = 256
    num_attention_heads: int = 4
    num_query_groups: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 512
    bpe_vocab: int = 600  # regular tokens (256 bytes + merges) before the special tokens
    # qwen3_moe: every layer routed, top-2 of 4 experts, renormalised (as Qwen3-30B-A3B's config).
    num_experts: int = 4
    moe_ffn_hidden_size: int = 128
    moe_topk: int = 2


SIZE = FixtureSize()


def _corpus() -> list[str]:
    """Prompts and reference solutions of the bundled problems: the text the recipes tokenize."""
    texts = []
    for line in BUNDLED.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            texts += [rec["prompt"], rec.get("solution", "")]
    return [t for t in texts if t]


def train_tokenizer(style: FamilyStyle, bpe_vocab: int):
    """A byte-level BPE like the family's, with its special tokens after the regular vocabulary."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(style.split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    # Added after training, so they take the ids after the merges, as in the released vocabularies.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in style.specials])
    if style.plain_added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in style.plain_added])
    if style.bos is not None:  # Llama-3 prepends <|begin_of_text|> to every encoding
        bos_id = tok.token_to_id(style.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{style.bos}:0 $A:0",
            pair=f"{style.bos}:0 $A:0 {style.bos}:1 $B:1",
            special_tokens=[(style.bos, bos_id)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _model_vocab(tokens: int, multiple: int) -> int:
    return -(-tokens // multiple) * multiple


def _spec(family: str, style: FamilyStyle, vocab: int) -> ModelSpec:
    """The fixture's architecture as a spec: its config and random weights then come from the project's
    own spec-to-HF path (models/tiny.py), the one every other test checkpoint takes."""
    rope = style.rope_scaling or {}
    return ModelSpec(
        name=f"{family}_fixture",
        family=family,
        num_layers=SIZE.num_layers,
        hidden_size=SIZE.hidden_size,
        ffn_hidden_size=SIZE.ffn_hidden_size,
        num_attention_heads=SIZE.num_attention_heads,
        num_query_groups=SIZE.num_query_groups,
        head_dim=SIZE.head_dim,
        vocab_size=vocab,
        make_vocab_size_divisible_by=1,
        max_position_embeddings=SIZE.max_position_embeddings,
        rope_theta=style.rope_theta,
        norm_eps=style.rms_norm_eps,
        qkv_bias=family == "qwen2",
        qk_norm=family in ("qwen3", "qwen3_moe"),
        tie_word_embeddings=style.tie_word_embeddings,
        params_dtype="fp32",
        rope_scaling=rope.get("rope_type", "none"),
        rope_scaling_factor=rope.get("factor", 1.0),
        rope_low_freq_factor=rope.get("low_freq_factor", 1.0),
        rope_high_freq_factor=rope.get("high_freq_factor", 4.0),
        rope_original_max_position=rope.get("original_max_position_embeddings", 0),
        **(moe_fields() if family == "qwen3_moe" else {}),
    )


def moe_fields() -> dict:
    return dict(
        num_experts=SIZE.num_experts,
        moe_ffn_hidden_size=SIZE.moe_ffn_hidden_size,
        moe_topk=SIZE.moe_topk,
        moe_norm_topk_prob=True,
    )


def _released_rope_layout(config_json: Path, style: FamilyStyle) -> None:
    """Rewrite transformers 5's `rope_parameters` as the released checkpoints hold RoPE: `rope_theta`
    and `rope_scaling` at the top level (what users' config.json files, written by transformers 4, carry)."""
    cfg = json.loads(config_json.read_text())
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = style.rope_theta
    cfg["rope_scaling"] = dict(style.rope_scaling) if style.rope_scaling else None
    config_json.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _params(family: str, seed: int) -> dict:
    return {"format": FORMAT, "family": family, "seed": seed, "size": asdict(SIZE)}


def _complete(out_dir: Path, params: dict) -> bool:
    marker = out_dir / MARKER
    return marker.is_file() and json.loads(marker.read_text()).get("params") == params


def _write(family: str, out_dir: Path, seed: int, params: dict) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    style = STYLES[family]
    tok = train_tokenizer(style, SIZE.bpe_vocab)
    ids = {t: tok.token_to_id(t) for t in style.specials + style.plain_added}
    vocab = _model_vocab(tok.get_vocab_size(), style.vocab_multiple)
    model = hf_model(_spec(family, style, vocab), seed)  # random weights, norms moved off 1
    config = model.config
    config.bos_token_id = ids[style.bos] if style.bos else ids["<|endoftext|>"]
    # config.json names the end of turn as the released instruct models do (Llama-3.1: all three).
    config.eos_token_id = [ids[t] for t in style.generation_eos] if family == "llama" else ids[style.eos]
    config.pad_token_id = None
    model.save_pretrained(out_dir, safe_serialization=True)
    _released_rope_layout(out_dir / "config.json", style)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[ids[t] for t in style.generation_eos],
        pad_token_id=ids[style.pad],
    ).save_pretrained(out_dir)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=style.bos,
        eos_token=style.eos,
        pad_token=style.pad,
        chat_template=style.template,
        model_max_length=SIZE.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.save_pretrained(out_dir)
    # The released tokenizer class (Qwen's own; Llama-3 ships the generic fast tokenizer).
    tc_path = out_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = style.tokenizer_class
    tc["add_bos_token"] = style.bos is not None
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    summary = {
        "vocab_size": vocab,
        "tokenizer_size": tok.get_vocab_size(),
        "special_ids": ids,
        "eos": style.eos,
        "generation_eos": style.generation_eos,
    }
    (out_dir / MARKER).write_text(json.dumps({"params": params, **summary}, indent=2) + "\n")


def build_fixture(family: str, out_dir: Path, seed: int = 0) -> Path:
    """Write (or reuse) the tiny `family` checkpoint at `out_dir`; returns `out_dir`.

    An existing folder is reused when its `fixture.json` records the same parameters; an empty folder
    is filled; anything else there is refused rather than overwritten.
    """
    if family not in STYLES:
        raise ValueError(f"unknown fixture family {family!r}; one of {FAMILIES}")
    out_dir = Path(out_dir)
    params = _params(family, seed)
    if _complete(out_dir, params):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(
            f"{out_dir} holds something other than a {family} fixture of seed {seed} "
            f"(no matching {MARKER}); remove it or pick another folder"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        _write(family, tmp, seed, params)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the fixture from the job's other users
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above); a concurrent builder may have filled it since
        os.replace(tmp, out_dir)
    except OSError:
        # Another process (a rank of the same job) renamed its identical build into place first.
        if not _complete(out_dir, params):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m megatron_rl.models.fixture",
        description="Write a tiny random HF checkpoint in a family's released format (weights, configs, "
        "tokenizer, chat template).",
    )
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        path = build_fixture(args.family, args.out_dir, args.seed)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
