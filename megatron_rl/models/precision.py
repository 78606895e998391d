"""What fp32 means on a GPU: the settings under which the GPU checks' fp32 comparisons are fp32.

On Ampere and later GPUs several libraries run float32 matrix products as TF32 (10 mantissa bits,
~1e-3 relative error) unless told not to, so a check of fp32 log-probs against transformers at 1e-4
would fail on a GPU for a reason that is not a bug:
- transformer-engine asks cuBLASLt for `CUBLAS_COMPUTE_32F_FAST_TF32` whenever a GEMM's inputs and
  output are all fp32 (common/gemm/cublaslt_gemm.cu, 2.11), with no switch of its own;
  `NVIDIA_TF32_OVERRIDE=0` is the NVIDIA libraries' global override;
- torch follows `torch.backends.cuda.matmul.allow_tf32` / `set_float32_matmul_precision` and cuDNN's
  flag, and NGC containers set `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`, which forces TF32 back on;
- Triton's `tl.dot` on fp32 inputs defaults to TF32 (vLLM's fused-MoE and attention kernels) unless
  `TRITON_F32_DEFAULT=ieee`.

`strict_fp32()` sets all of them, in this process (before CUDA starts) and for its children, and
returns what it set; `tf32_in_effect()` then measures, on the device, whether an fp32 GEMM through
torch and through TE still carries TF32's error, so a check reports the precision it ran at instead of
assuming it. Used by tools/gpu_check.py and the GPU-marked tests; a training run keeps the libraries'
defaults.
"""

from __future__ import annotations

import os

STRICT_FP32_ENV = {
    "NVIDIA_TF32_OVERRIDE": "0",  # cuBLAS / cuBLASLt / cuDNN: never TF32 (TE's fp32 GEMMs included)
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0",  # undo NGC's forced TF32 in torch's cuBLAS calls
    "TRITON_F32_DEFAULT": "ieee",  # Triton's fp32 tl.dot (vLLM's fused MoE) in IEEE fp32
    "VLLM_FLOAT32_MATMUL_PRECISION": "highest",  # what vLLM's GPU worker sets torch's precision to
}
# An fp32 GEMM's error relative to its largest output: ~1e-6 in IEEE fp32, ~1e-3 with TF32 inputs.
TF32_ERROR = 1e-4


def strict_fp32() -> dict:
    """Turn TF32 off for every library the GPU checks go through; returns the settings now in force."""
    os.environ.update(STRICT_FP32_ENV)
    import torch

    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return precision_settings()


def precision_settings() -> dict:
    """The fp32 settings of this process, as the report records them."""
    import torch

    return {
        "env": {k: os.environ.get(k) for k in STRICT_FP32_ENV},
        "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def _relative_error(got, want) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


def tf32_in_effect(device) -> dict:
    """Measured on `device`: the relative error of an fp32 GEMM through torch and through TE's Linear
    against float64, and whether either is at TF32's level (None: not measurable here, with why)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(256, 1024, generator=g).to(device)
    b = torch.randn(1024, 512, generator=g).to(device)
    out = {"torch_matmul": _relative_error(a @ b, a.double() @ b.double())}
    try:
        import transformer_engine.pytorch as te

        lin = te.Linear(1024, 512, bias=False, params_dtype=torch.float32, device=device)
        with torch.no_grad():
            out["te_linear"] = _relative_error(lin(a), a.double() @ lin.weight.double().T)
    except Exception as e:  # no TE here (CPU, or a GPU run with the local spec): nothing of TE's to measure
        out["te_linear"] = None
        out["te_linear_why"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    out["tf32"] = any(v is not None and v > TF32_ERROR for k, v in out.items() if not k.endswith("_why"))
    return out
