"""GPU-only MoE engine paths on the qwen3_moe fixture (run by test_gpu_moe.py; needs CUDA + official vLLM).

    python worker_gpu_moe.py OUT_JSON FIXTURE_DIR

1. In-place delivery of a Qwen3-MoE: the engine starts from dummy weights, receives every tensor in its
   own layout (reshard/convert.py `engine_layouts(..., "inplace")`: one slice per expert of vLLM's
   fused-MoE parameters, Triton backend pinned) and then samples what transformers scores.
2. vLLM's own routed-experts capture (`enable_return_routed_experts`): each sample's routes equal
   transformers' router top-k at every fed position and layer.
"""

import json
import sys
from pathlib import Path

import torch

from megatron_rl.config.schema import ModelConfig
from megatron_rl.models.spec import ModelSpec
from megatron_rl.reshard.convert import engine_layouts, materialize
from megatron_rl.rollout.vllm_engine import VLLMEngine
from tests.integration.rollout.cases import rollout_cfg

OUT, FIXTURE = sys.argv[1], Path(sys.argv[2])


def main():
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from megatron_rl.models.precision import strict_fp32

    strict_fp32()  # vLLM's fused MoE is a Triton kernel: its fp32 tl.dot is TF32 unless told otherwise

    spec = ModelSpec.from_config(ModelConfig(hf_checkpoint=str(FIXTURE), params_dtype="fp32"))
    hf = load_file(str(FIXTURE / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    cfg = rollout_cfg(max_new_tokens=16, temperature=1.0, logprobs_mode="raw_logprobs")
    eng = VLLMEngine(cfg, FIXTURE, tp=1, seed=0, load_format="dummy", dtype="float32", max_model_len=256,
                     record_routes=True)  # fmt: skip
    tensors = [(lay.name, materialize(lay, hf).cuda()) for lay in engine_layouts(spec, "inplace", 1, 0)]
    eng.update_weights_inplace(tensors, version=1)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 600, (n,), generator=g).tolist() for n in (20, 9)]
    samples = eng.generate(prompts, 3)
    worst, agree, pairs = 0.0, 0, 0
    k = spec.moe_topk
    for s in samples:
        seq = s.prompt_ids + s.token_ids
        with torch.no_grad():
            out = model(torch.tensor([seq]), output_router_logits=True)
        lp = torch.log_softmax(out.logits[0].float(), -1)
        ref = lp[torch.arange(len(s.prompt_ids) - 1, len(seq) - 1), torch.tensor(s.token_ids)]
        worst = max(worst, float((ref - torch.tensor(s.logprobs)).abs().max()))
        for layer, logits in enumerate(out.router_logits):
            want = logits[: len(seq) - 1].float().topk(k, -1).indices.sort(-1).values
            got = s.routes[:, layer].long().sort(-1).values
            agree += int((want == got).all(-1).sum())
            pairs += want.shape[0]
    Path(OUT).write_text(json.dumps({"max_abs_diff": worst, "routes_agree": agree, "route_pairs": pairs,
                                     "versions": sorted({s.version for s in samples})}))  # fmt: skip


if __name__ == "__main__":
    main()
