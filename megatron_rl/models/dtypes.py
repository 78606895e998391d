"""The parameter dtypes the project trains and serves in, under each of their names, in one place.

A dtype has three spellings here: the recipe's (`model.params_dtype`: bf16, fp16, fp32), the one HF
configs and vLLM use ("bfloat16", "float16", "float32"; config.json's `torch_dtype`), and the torch
dtype. Every function takes either string spelling, so a value read from a config.json and one read
from a recipe go through the same door, and an unknown name fails here, naming the accepted ones.

torch is imported inside `torch_dtype` only: the capacity planner imports models/spec.py, which
counts bytes through this module, and must run without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

RECIPE_DTYPES = ("bf16", "fp16", "fp32")
_HF_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_FROM_HF = {hf: recipe for recipe, hf in _HF_NAMES.items()}


def recipe_dtype(name: str, what: str = "dtype") -> str:
    """The recipe's name (bf16/fp16/fp32) for a recipe or HF name: the reverse lookup of a config.json's
    `torch_dtype`. `what` names the setting in the error (e.g. "engine dtype")."""
    if name in _HF_NAMES:
        return name
    if name in _FROM_HF:
        return _FROM_HF[name]
    accepted = sorted(_HF_NAMES) + sorted(_FROM_HF)
    raise ValueError(f"{what} must be one of {accepted}; got {name!r}")


def hf_dtype_name(name: str, what: str = "dtype") -> str:
    """The HF/vLLM name ("bfloat16", ...) of a recipe or HF name: what config.json and vLLM's `dtype=` take."""
    return _HF_NAMES[recipe_dtype(name, what)]


def dtype_bytes(name: str, what: str = "dtype") -> int:
    """Bytes per element of a recipe or HF name (torch-free: the planner counts with it)."""
    return _BYTES[recipe_dtype(name, what)]


def torch_dtype(name: str, what: str = "dtype") -> torch.dtype:
    """The torch dtype of a recipe or HF name."""
    import torch

    return getattr(torch, hf_dtype_name(name, what))
