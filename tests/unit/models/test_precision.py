"""fp32 means fp32 in the GPU checks (models/precision.py): strict_fp32() turns TF32 off in torch, cuBLAS
(transformer-engine's fp32 GEMMs), Triton (vLLM's fused MoE) and vLLM's worker, in a fresh interpreter
that starts as an NGC container does (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, torch's TF32 flags on), and
the measurement that confirms it on the device finds IEEE fp32 here (no TE on CPU: said so)."""

import json
import subprocess
import sys

from tests.helpers.launch import REPO

PROBE = """
import json, torch
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
from megatron_rl.models.precision import strict_fp32, tf32_in_effect
settings = strict_fp32()
print(json.dumps({"settings": settings, "measured": tf32_in_effect(torch.device("cpu"))}))
"""


def test_strict_fp32_sets_every_library_and_the_measurement_confirms_it():
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["settings"] == {
        "env": {
            "NVIDIA_TF32_OVERRIDE": "0",
            "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0",
            "TRITON_F32_DEFAULT": "ieee",
            "VLLM_FLOAT32_MATMUL_PRECISION": "highest",
        },
        "torch_float32_matmul_precision": "highest",
        "torch_matmul_allow_tf32": False,
        "cudnn_allow_tf32": False,
    }
    m = out["measured"]
    assert m["torch_matmul"] < 1e-5 and m["tf32"] is False
    assert m["te_linear"] is None and m["te_linear_why"].startswith("ModuleNotFoundError")
