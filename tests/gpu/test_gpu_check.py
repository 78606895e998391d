"""tools/gpu_check.py on CUDA (skipped without it): every check of the trainer's GPU path passes,
with no CPU patch applied, and the ~1B bf16 MFU is measured."""

import json
import subprocess
import sys

import pytest
import torch

from megatron_rl.models.precision import STRICT_FP32_ENV

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_gpu_check_passes_on_cuda(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "tools/gpu_check.py", "--device", "cuda", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**__import__("os").environ, **STRICT_FP32_ENV, "MEGATRON_RL_DEVICE_GUARD": "1"},
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    failed = {k: v.get("error") for k, v in report.items() if isinstance(v, dict) and not v.get("ok", True)}
    assert proc.returncode == 0 and report.get("ok"), f"failed checks: {failed}\n{proc.stderr[-3000:]}"
    assert report["precision"]["ok"], "TF32 still in effect: " + str(report["precision"]["measured"])
    assert report["precision"]["measured"]["te_linear"] is not None, "TE's GEMM measured on the GPU"
    assert report["hf"]["cpu_patches_applied"] == []
    assert report["hf"]["max_abs_diff_vs_hf"]["fp32"] <= 1e-4
    assert report["moe"]["dispatcher"] == "alltoall" and report["moe"]["max_abs_diff_vs_hf"] <= 1e-4
    assert report["timer_cuda"] and report["mfu"]["dtype"] == "bf16" and 0 < report["mfu"]["mfu"] < 1
