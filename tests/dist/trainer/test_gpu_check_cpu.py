"""The dry run of tools/gpu_check.py on CPU (`--device cpu`, tiny models), under the device guard:
the one-GPU check is ready before a device is lent, and every check in it passes here."""

import json

import pytest

from tests.helpers.launch import free_port, run_worker

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {"MASTER_PORT": str(free_port()), "MEGATRON_RL_DEVICE_GUARD": "1"}
    run_worker("tools/gpu_check.py", ["--device", "cpu", "--out", str(out)], timeout=600, env=env)
    report = json.loads(out.read_text())
    checks = ("precision", "hf", "train", "preempt", "moe", "publish", "ckpt", "mfu", "telemetry")
    assert {c: report[c]["ok"] for c in checks} == dict.fromkeys(checks, True), report
    assert report["ok"] is True
    # fp32 means fp32: TF32 off in torch, cuBLAS and Triton before CUDA starts, and measured (no TE here)
    precision = report["precision"]
    assert precision["settings"]["env"]["NVIDIA_TF32_OVERRIDE"] == "0"
    assert precision["settings"]["env"]["TRITON_F32_DEFAULT"] == "ieee"
    assert precision["settings"]["torch_matmul_allow_tf32"] is False
    assert precision["measured"]["tf32"] is False and precision["measured"]["te_linear"] is None
    assert (
        precision["fp32_tolerance"]
        == report["hf"]["fp32_tolerance"]
        == report["moe"]["fp32_tolerance"]
        == 1e-4
    )
    assert report["hf"]["max_abs_diff_vs_hf"]["fp32"] <= 1e-4
    assert "current_device" in report["hf"]["cpu_patches_applied"]  # CPU: the patches are what runs
    assert report["train"]["metrics"]["update_successful"] == 1.0 and report["train"]["max_param_change"] > 0
    assert report["preempt"]["after_signal"] is True
    assert report["moe"]["max_abs_diff_vs_hf"] <= 1e-4 and report["moe"]["router_moved"] > 0
    assert report["moe"]["dispatcher"] == "allgather"
    assert report["publish"]["loader"]["max_abs_diff"] == 0.0 and report["publish"]["inplace"]["activated"]
    assert report["ckpt"]["max_abs_diff_after_load"] == 0.0
    assert report["mfu"]["tflops"] > 0
    assert set(report["telemetry"]["phases"]) >= {
        "old_logprobs",
        "ref_logprobs",
        "train_fwd_bwd",
        "optimizer",
    }


def test_wrong_device_is_refused_in_one_line(tmp_path):
    with pytest.raises(AssertionError, match="--device cuda but this machine has no CUDA device"):
        run_worker("tools/gpu_check.py", ["--device", "cuda", "--out", str(tmp_path / "x.json")], timeout=120)
