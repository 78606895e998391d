"""The trainer on CUDA (skipped without it): tools/gpu_check.py's log-prob agreement with HF."""

import json
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_gpu_logprobs_match_hf_without_cpu_patches(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "tools/gpu_check.py", "--skip-mfu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["logprobs"]["cpu_patches_applied"] == []
    assert report["logprobs"]["max_abs_diff_vs_hf"]["fp32"] <= 1e-4
