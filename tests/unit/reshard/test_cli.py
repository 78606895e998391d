"""`megatron-rl reshard-plan`: text and JSON agree with the plan; bad input exits 2 with the reason."""

import json

from megatron_rl.cli.reshard import main
from megatron_rl.config.load import load_recipe
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.plan import Links, build_plan


def test_json_matches_the_plan(capsys):
    assert (
        main(["grpo_tiny_cpu", "layout.engine_tp=2", "layout.engine_count=1", "--json", "--rank", "1"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    r = load_recipe("grpo_tiny_cpu", ["layout.engine_tp=2", "layout.engine_count=1"])
    spec = ModelSpec.from_config(r.model)
    plan = build_plan(ParallelLayout.from_config(r.layout), spec, "loader", Links.from_cluster(r.cluster), 4)
    rb = plan.rank_bytes()
    assert out["delivery"] == "loader"  # the CPU cluster's default: vLLM's CPU build loads whole tensors
    assert out["engines"] == {"tp": 2, "count": 1, "ranks": 2}
    assert out["bytes"]["intra_node"] == sum(b["sent_intra"] for b in rb.values()) > 0
    assert out["bytes"]["staged_per_engine_rank"] == plan.target_bytes(0)
    assert out["lower_bound_s"] == plan.lower_bound_s()[0] > 0
    # cpu_2core: one node, 5 GB/s per "GPU": the bound is the busiest rank's bytes over that rate.
    assert abs(out["lower_bound_s"] - out["busiest_receiver"]["recv_intra"] / 5e9) < 1e-12
    assert sum(v["tensors"] for v in out["ops"].values()) == 2 * len(plan.targets[0])
    names = [t["name"] for t in out["rank"]["tensors"]]
    assert names[0] == "model.embed_tokens.weight" and len(names) == len(plan.targets[1])


def test_text_output_and_inplace_delivery(capsys):
    assert main(["grpo_tiny_cpu", "--delivery", "inplace", "--bucket-mb", "1"]) == 0
    text = capsys.readouterr().out
    assert "delivery=inplace" in text and "lower bound" in text and "buckets:" in text
    assert "view" in text  # trainer TP2 -> TP1 engines: norms are local views


def test_errors_exit_2_with_the_reason(capsys):
    assert main(["no_such_recipe"]) == 2
    assert "no recipe named" in capsys.readouterr().err
    assert main(["grpo_tiny_cpu", "layout.engine_count=3"]) == 2
    assert "engine_count" in capsys.readouterr().err
    assert main(["grpo_tiny_cpu", "layout.engine_tp=2", "layout.engine_count=1", "--rank", "5"]) == 2
    assert "not an engine rank" in capsys.readouterr().err
