"""Export the policy as an HF safetensors directory (what `transformers` and vLLM load).

The whole model arrives on rank 0 by `trainer/gather.py full_state` (tensor by tensor, never a stage on
a device); rank 0 then converts names and fused layouts back to HF's (padding removed) and writes
`model.safetensors` + `config.json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from megatron_rl.models.dtypes import hf_dtype_name, torch_dtype
from megatron_rl.models.hf import megatron_full_to_hf

# What an HF directory holds besides weights and config.json, copied from the checkpoint the run
# started from so the export loads with its tokenizer, chat template and end-of-sequence ids.
COMPANION_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def _umask() -> int:
    """This process's umask (reading it means setting it; it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_hf(
    full: dict[str, torch.Tensor] | None,
    spec,
    out_dir: str | Path,
    dtype: str | None = None,
    source: str | None = None,
) -> Path | None:
    """Write the HF directory from the model's full megatron tensors (`full_state` on rank 0; None or empty
    elsewhere, where nothing is written). Returns its path where written, else None.

    `source`, the HF checkpoint the run started from, lends its tokenizer and generation config."""
    from safetensors.torch import save_file

    from megatron_rl.models.tiny import hf_config

    if not full:
        return None
    hf: dict[str, torch.Tensor] = {}
    for name, t in full.items():
        for k, v in megatron_full_to_hf(spec, name, t).items():
            hf.setdefault(k, v)  # tied embeddings: the first copy (the embedding) wins
    if spec.tie_word_embeddings:
        hf.pop("lm_head.weight", None)
    hf_dtype = hf_dtype_name(dtype or spec.params_dtype)
    tdtype = torch_dtype(hf_dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / "model.safetensors"
    save_file({k: v.to(tdtype).contiguous() for k, v in hf.items()}, str(weights), metadata={"format": "pt"})
    # safetensors creates its file 0600 whatever the umask; the export is shared like the files beside it
    # (config.json, the tokenizer: 0644 under the usual umask 022), so it gets the mode they get.
    weights.chmod(0o666 & ~_umask())
    hf_config(spec, hf_dtype).save_pretrained(out)
    if source:
        import shutil

        for name in COMPANION_FILES:
            if (Path(source) / name).is_file():
                shutil.copyfile(Path(source) / name, out / name)
    (out / "megatron_rl_export.json").write_text(json.dumps({"tensors": len(hf), "dtype": hf_dtype}))
    return out
