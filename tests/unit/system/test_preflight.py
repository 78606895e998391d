"""The pre-flight verdict (system/preflight.py) on figures written by hand, and its measurements on
this machine's CPU; the GPU measurements on a GPU."""

from __future__ import annotations

import sys

import pytest
import torch

from megatron_rl.config.load import load_recipe
from megatron_rl.system import preflight as pf

EXPECT = pf.Expected(
    gemm_tflops=989.0,
    memory_gbps=3350.0,
    intra_gbps=900.0,
    inter_gbps=50.0,
    gemm_fraction=0.5,
    memory_fraction=0.6,
    allreduce_fraction=0.3,
)


def healthy(rank: int, host: str, **kw) -> pf.RankFigures:
    base = {"gemm_tflops": 700.0, "memory_gbps": 2900.0, "intra_gbps": 420.0, "inter_gbps": 45.0}
    nvml = {"ok": True, "problems": [], "ecc_uncorrected_volatile": 0}
    return pf.RankFigures(rank=rank, host=host, device=f"GPU {rank % 2}", nvml=nvml, **{**base, **kw})


def test_expected_figures_come_from_the_cluster_config():
    c = load_recipe("grpo_qwen2.5-32b_32n8g").cluster
    e = pf.Expected.from_cluster(c)
    assert e.gemm_tflops == c.peak_tflops_bf16 and e.memory_gbps == pytest.approx(c.hbm_bandwidth_tbps * 1000)
    # 8 NICs of 400 Gb/s for 8 GPUs: 50 GB/s per GPU across nodes
    assert e.inter_gbps == pytest.approx(c.ib_gbps_per_nic * c.nics_per_node / c.gpus_per_node / 8)
    assert (e.gemm_fraction, e.memory_fraction, e.allreduce_fraction) == (0.5, 0.6, 0.3)


def test_healthy_nodes_pass_and_each_kind_of_sick_one_is_named_with_why():
    ranks = [healthy(r, f"n{r // 2}") for r in range(10)]
    ranks[3] = healthy(3, "n1", gemm_tflops=400.0)  # one slow GPU: its node fails
    ranks[4] = healthy(4, "n2", memory_gbps=1500.0)
    ranks[6] = healthy(6, "n3", intra_gbps=100.0)
    ranks[9].nvml = {"ok": False, "problems": ["2 uncorrected ECC error(s) since the driver loaded"]}
    nodes, job = pf.judge(ranks, EXPECT)
    verdict = {n.host: n for n in nodes}
    assert [n.host for n in nodes] == ["n0", "n1", "n2", "n3", "n4"] and job == []
    assert verdict["n0"].passed and verdict["n0"].ranks == [0, 1]
    assert verdict["n1"].failures == ["gemm 400 TFLOPS on GPU 1 < 0.5 x 989 TFLOPS expected"]
    assert verdict["n1"].figures["gemm_tflops"] == 400.0, "a node is as fast as its slowest GPU"
    assert verdict["n2"].failures == ["memory copy 1.5e+03 GB/s on GPU 0 < 0.6 x 3.35e+03 GB/s expected"]
    assert verdict["n3"].failures == ["all-reduce in the node 100 GB/s < 0.3 x 900 GB/s expected"]
    assert verdict["n4"].failures == ["GPU 1: 2 uncorrected ECC error(s) since the driver loaded"]
    # Exactly at the threshold passes; a node's NVML that says nothing is not healthy.
    edge = [healthy(0, "a", gemm_tflops=494.5), healthy(1, "a")]
    edge[1].nvml = {"ok": False}
    ((a,), _) = pf.judge(edge, EXPECT)
    assert a.failures == ["GPU 1: NVML health unknown"]


def test_a_slow_ring_across_nodes_fails_the_job_not_a_node():
    ranks = [healthy(r, f"n{r // 2}", inter_gbps=10.0 if r == 2 else 45.0) for r in range(4)]
    nodes, job = pf.judge(ranks, EXPECT)
    assert all(n.passed for n in nodes)
    assert job == ["all-reduce across nodes 10 GB/s < 0.3 x 50 GB/s expected"]
    one = [pf.RankFigures(rank=0, host="a", device="cpu", gemm_tflops=900.0, memory_gbps=3000.0)]
    nodes, job = pf.judge(one, EXPECT)
    assert nodes[0].passed and nodes[0].figures["allreduce_intra_gbps"] is None and job == []


def test_nvml_missing_is_a_failure_not_a_pass(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    h = pf.nvml_health(0)
    assert h["ok"] is False and "nvidia-ml-py" in h["problems"][0]


def test_cpu_measurements_are_real_rates():
    cpu = torch.device("cpu")
    assert 1e-4 < pf.gemm_tflops(cpu) < 10, "a 1024^3 fp32 matmul on one CPU core"
    assert 0.5 < pf.memory_gbps(cpu) < 1000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_measurements_and_nvml_on_a_real_gpu():
    dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(dev)
    tflops, gbps = pf.gemm_tflops(dev), pf.memory_gbps(dev)
    assert tflops > 50 and gbps > 300, (name, tflops, gbps)  # any datacenter GPU of this decade
    h = pf.nvml_health(0)
    assert "ecc_uncorrected_volatile" in h, h


def test_bad_input_is_refused_before_anything_is_measured(capsys):
    """Exit 2, one line naming what is wrong: a fraction above 1 (a test that always fails), a recipe
    that does not exist, a GPU cluster where CUDA is unavailable."""
    from megatron_rl.cli.preflight import main

    assert main(["grpo_tiny_cpu", "cluster.preflight_gemm_fraction=2"]) == 2
    assert "cluster.preflight_gemm_fraction=2.0: must be finite and in [0, 1]" in capsys.readouterr().err
    assert main(["nosuch"]) == 2 and "no recipe named 'nosuch'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["grpo_qwen2.5-7b_1n8g"]) == 2
        assert "CUDA is unavailable" in capsys.readouterr().err
    assert main(["grpo_tiny_cpu", "--ranks", "0"]) == 2 and "--ranks 0" in capsys.readouterr().err


def test_a_figure_that_is_not_a_number_fails_its_node():
    """A NaN rate (a timer or a device gone wrong) is no proof of health: below every threshold."""
    nan = float("nan")
    # On any rank of the node (a healthy one beside it must not hide it), in every test.
    ranks = [healthy(0, "a"), healthy(1, "a", gemm_tflops=nan, memory_gbps=nan, intra_gbps=nan)]
    ((node,), _) = pf.judge(ranks, EXPECT)
    assert [f.split(" ")[:3] for f in node.failures] == [
        ["gemm", "nan", "TFLOPS"],
        ["memory", "copy", "nan"],
        ["all-reduce", "in", "the"],
    ], node.failures
    two = [healthy(r, f"n{r // 2}", inter_gbps=nan if r == 3 else 45.0) for r in range(4)]
    assert pf.judge(two, EXPECT)[1] == ["all-reduce across nodes nan GB/s < 0.3 x 50 GB/s expected"]
