"""Import an HF safetensors checkpoint straight into any TP x PP layout.

Each rank reads only the rows/columns it owns (safetensors slices: the file is memory-mapped, so a
rank of a 70B model at TP8 x PP4 touches ~1/32 of it). The whole directory is checked first (every
tensor present, shape and dtype right, config.json consistent with the recipe) and only then is
anything written into the model, so a malformed checkpoint leaves the model untouched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from megatron_rl.models.dtypes import torch_dtype
from megatron_rl.models.hf import (
    SCORE,
    VALUE_HEAD,
    all_hf_names,
    expert_of,
    hf_shape,
    hf_to_megatron_shard,
    megatron_names,
    tp_of,
)
from megatron_rl.models.megatron import global_param_name
from megatron_rl.models.resolve import CheckpointConfigError, differences, fields_from_config
from megatron_rl.models.spec import ModelSpec

_ST_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointError(ValueError):
    """A malformed HF checkpoint directory; the message names the tensor or key."""


@dataclass
class HFCheckpoint:
    """An opened HF safetensors directory: tensor name -> file, with lazy slicing reads."""

    path: Path
    files: dict[str, Path]  # tensor name -> shard file
    config: dict

    @classmethod
    def open(cls, path: str | Path) -> HFCheckpoint:
        from safetensors import safe_open

        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"HF checkpoint {path} is not a directory (model.hf_checkpoint)")
        cfg_file = path / "config.json"
        config = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        index = path / "model.safetensors.index.json"
        files: dict[str, Path] = {}
        if index.exists():
            for name, fname in json.loads(index.read_text())["weight_map"].items():
                files[name] = path / fname
        else:
            shards = sorted(path.glob("*.safetensors"))
            if not shards:
                raise CheckpointError(f"no *.safetensors files in {path}")
            for shard in shards:
                with safe_open(str(shard), "pt") as f:
                    for name in f.keys():
                        files[name] = shard
        return cls(path=path, files=files, config=config)

    def _handle(self, file: Path):
        from safetensors import safe_open

        if not hasattr(self, "_handles"):
            self._handles = {}
        if file not in self._handles:
            self._handles[file] = safe_open(str(file), "pt")
        return self._handles[file]

    def meta(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        sl = self._handle(self.files[name]).get_slice(name)
        return tuple(sl.get_shape()), _ST_DTYPES.get(sl.get_dtype(), None)

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        """The slice [start:stop) of `name` along dim (the whole tensor when dim is None)."""
        h = self._handle(self.files[name])
        if dim is None:
            return h.get_tensor(name)
        sl = h.get_slice(name)
        return sl[start:stop] if dim == 0 else sl[:, start:stop]


def check_checkpoint(ckpt: HFCheckpoint, spec: ModelSpec, value_head: bool = False) -> torch.dtype:
    """Refuse a checkpoint that does not match the spec (`value_head`: a one-label sequence-classification
    checkpoint, `score.weight` in place of the LM head). Returns the checkpoint's dtype."""
    # The recipe check compared the recipe with this config.json (models/resolve.py); this is the same
    # comparison at load time, for callers that build a spec by other means (tools, tests).
    if ckpt.config:
        try:
            fields = fields_from_config(ckpt.config, f"{ckpt.path}/config.json")
        except CheckpointConfigError as e:
            raise CheckpointError(str(e)) from None
        for key, mine, theirs in differences(spec, fields):
            raise CheckpointError(
                f"{ckpt.path}/config.json gives {key}={theirs!r} but the model's spec has {mine!r}: point "
                "model.hf_checkpoint at the right model or fix the model group"
            )
    declared = ckpt.config.get("torch_dtype") or ckpt.config.get("dtype")
    try:
        expected_dtype = torch_dtype(declared) if isinstance(declared, str) else None
    except ValueError:  # a dtype we do not train in (float64, "auto"): the tensors alone decide
        expected_dtype = None
    seen_dtype = None
    for name in all_hf_names(spec, value_head):
        if name not in ckpt.files:
            hint = ""
            if value_head and name == SCORE:
                hint = ": a reward model is an HF *ForSequenceClassification checkpoint with num_labels=1"
            raise CheckpointError(f"HF checkpoint {ckpt.path} is missing tensor {name!r}{hint}")
        shape, dtype = ckpt.meta(name)
        want = hf_shape(spec, name)
        if shape != want:
            raise CheckpointError(
                f"tensor {name!r} in {ckpt.path} has shape {list(shape)}, expected {list(want)}"
            )
        if dtype is None or not dtype.is_floating_point:
            raise CheckpointError(f"tensor {name!r} in {ckpt.path} has non-float dtype {dtype}")
        ref = expected_dtype or seen_dtype or dtype
        if dtype != ref:
            raise CheckpointError(
                f"tensor {name!r} in {ckpt.path} has dtype {dtype}, but the checkpoint is {ref} "
                f"(config.json dtype={declared!r}); re-save the checkpoint in one dtype"
            )
        seen_dtype = dtype
    return seen_dtype or torch.float32


def load_hf_into(
    model,
    spec: ModelSpec,
    path: str | Path,
    tp: int,
    tp_rank: int,
    padded_vocab: int,
    etp: int = 1,
    etp_rank: int = 0,
    value_head: bool = False,
) -> int:
    """Fill a PP stage's GPTModel from an HF checkpoint. Returns the number of bytes read.

    An MoE model's expert weights are read at the expert TP (`etp`, `etp_rank`), and only the experts
    this EP rank holds. Every shard is built and checked before the first `copy_`, so an error leaves
    the model as it was. `value_head`: a value model (trainer/value.py) from a sequence-classification
    checkpoint, its score head included.
    """
    ckpt = HFCheckpoint.open(path)
    check_checkpoint(ckpt, spec, value_head)
    params = {global_param_name(model, n): p for n, p in model.named_parameters()}
    if (
        value_head and "output_layer.weight" in params
    ):  # the scalar head (trainer/value.py), by its mapping name
        params[VALUE_HEAD] = params.pop("output_layer.weight")
    layers = sorted({int(n.split(".")[2]) for n in params if n.startswith("decoder.layers.")})
    experts = sorted({e for e in map(expert_of, params) if e is not None})
    expected = set(
        megatron_names(
            spec,
            range(layers[0], layers[-1] + 1) if layers else range(0),
            "embedding.word_embeddings.weight" in params,
            "decoder.final_layernorm.weight" in params,
            range(experts[0], experts[-1] + 1) if experts else range(0),
            value_head=value_head,
        )
    )
    if set(params) != expected:
        raise RuntimeError(f"model parameters differ from the spec's names: {sorted(set(params) ^ expected)}")
    staged: dict[str, torch.Tensor] = {}
    nbytes = 0
    for name, p in params.items():
        rank = etp_rank if expert_of(name) is not None else tp_rank
        shard = hf_to_megatron_shard(spec, name, ckpt.read, tp_of(name, tp, etp), rank, padded_vocab)
        if tuple(shard.shape) != tuple(p.shape):
            raise CheckpointError(f"{name}: built shard {list(shard.shape)} != parameter {list(p.shape)}")
        nbytes += shard.numel() * shard.element_size()
        staged[name] = shard
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(staged[name].to(p.dtype))
    return nbytes
