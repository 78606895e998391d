"""Export the policy as an HF safetensors directory (what `transformers` and vLLM load).

Every rank of the model group takes part: TP shards are all-gathered and unsharded, PP stages send
their full tensors to rank 0, which converts names and fused layouts back to HF's (padding removed)
and writes `model.safetensors` + `config.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.models.hf import megatron_full_to_hf, tp_unshard


def full_state(policy) -> dict[str, torch.Tensor]:
    """Full megatron tensors of the whole model on rank 0 (empty dict elsewhere). Collective."""
    from megatron.core import parallel_state as ps

    tp_group = ps.get_tensor_model_parallel_group()
    tp = ps.get_tensor_model_parallel_world_size()
    mine: dict[str, torch.Tensor] = {}
    for name, p in policy.named_parameters_global():
        shards = [torch.empty_like(p) for _ in range(tp)]
        dist.all_gather(shards, p.detach().contiguous(), group=tp_group)
        mine[name] = tp_unshard(policy.spec, name, shards).cpu()
    # Stage leaders (TP rank 0, DP rank 0) hand their stage to rank 0.
    leader = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    parts: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine if leader else None)
    if dist.get_rank() != 0:
        return {}
    out: dict[str, torch.Tensor] = {}
    for part in parts:
        out.update(part or {})
    return out


def write_hf(policy, out_dir: str | Path, dtype: str | None = None) -> Path | None:
    """Write the HF directory (rank 0). Returns its path on rank 0, None elsewhere."""
    from safetensors.torch import save_file

    from megatron_rl.models.tiny import hf_config

    full = full_state(policy)
    if dist.get_rank() != 0:
        return None
    spec = policy.spec
    hf: dict[str, torch.Tensor] = {}
    for name, t in full.items():
        for k, v in megatron_full_to_hf(spec, name, t).items():
            hf.setdefault(k, v)  # tied embeddings: the first copy (the embedding) wins
    if spec.tie_word_embeddings:
        hf.pop("lm_head.weight", None)
    torch_dtype = dtype or {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[spec.params_dtype]
    tdtype = getattr(torch, torch_dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(tdtype).contiguous() for k, v in hf.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    hf_config(spec, torch_dtype).save_pretrained(out)
    (out / "megatron_rl_export.json").write_text(json.dumps({"tensors": len(hf), "dtype": torch_dtype}))
    return out
