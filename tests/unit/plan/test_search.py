"""The layout search: ranked by step time, every rejection with its reason."""

from __future__ import annotations

import dataclasses

from megatron_rl.config.load import load_recipe
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.plan.inputs import inputs_from_run
from megatron_rl.plan.memory import memory_fit
from megatron_rl.plan.search import CANDIDATE, search, structural_reason
from megatron_rl.run import resolve


def test_search_ranks_fitting_layouts_of_all_gpus(ref):
    inp, _ = ref
    res = search(inp)
    ranked = res["ranked"]
    assert res["gpus"] == 256 and len(ranked) > 10
    assert [c.step_s for c in ranked] == sorted(c.step_s for c in ranked)
    for c in ranked:
        assert c.fits and c.layout.gpus == 256
        assert memory_fit(inp, c.layout)["fits"]
    # colocated and separated layouts, both synchronies, are all considered
    kinds = {(c.layout.placement, c.layout.synchrony) for c in ranked}
    assert kinds == {("colocated", "sync"), ("separated", "sync"), ("separated", "async")}


def test_layouts_that_do_not_fit_are_rejected_with_the_reason(ref):
    inp, _ = ref
    rejected = search(inp)["rejected"]
    assert rejected and all(r["reason"] for r in rejected)
    # a TP1 engine cannot hold 61 GiB of Qwen2.5-32B weights in 0.6 x 80 GiB
    tp1 = [r for r in rejected if "x TP1 engines" in r["layout"]]
    assert tp1 and all(r["kind"] == "memory" and "leave no KV cache" in r["reason"] for r in tp1)
    # the memory reasons are the ones memory_fit gives for that layout
    first = next(r for r in rejected if r["kind"] == "memory")
    assert "GiB" in first["reason"]


def test_a_trainer_too_big_for_its_gpus_is_rejected_with_its_numbers(ref):
    inp, _ = ref
    small = dataclasses.replace(inp, hw=dataclasses.replace(inp.hw, gpu_memory_bytes=40 * 2**30))
    res = search(small, 16)
    trainer = [r for r in res["rejected"] if r["reason"].startswith("trainer needs")]
    assert trainer and all("> 40 GiB" in r["reason"] for r in trainer)


def test_structural_reasons(ref):
    inp, _ = ref
    base = ParallelLayout(
        tp=8,
        pp=2,
        dp=16,
        engine_tp=4,
        engine_count=64,
        **CANDIDATE,
    )
    assert structural_reason(inp, base) is None
    # The run's own rules (ParallelLayout.check), a collective across nodes named first.
    assert "does not fit inside one node of 8 GPUs" in structural_reason(inp, base.with_(tp=16, dp=8))
    assert "layout.pp=3: does not divide model.num_layers=64" in structural_reason(inp, base.with_(pp=3))
    # 4,096 samples / 4 minibatches = 1,024 sequences: DP 2,048 would leave ranks idle
    big = dataclasses.replace(inp, hw=dataclasses.replace(inp.hw, nodes=256))  # 2,048 GPUs
    idle = base.with_(tp=1, pp=1, dp=2048, engine_count=512)
    assert f"DP2048 x micro batch {inp.work.micro_batch_size} needs" in structural_reason(big, idle)
    assert "sequences per minibatch, which has 1,024 (idle ranks)" in structural_reason(big, idle)
    # The micro batch counts: 16 sequences of a minibatch at micro batch 16 leave a second DP rank idle.
    tiny = inputs_from_run(resolve(load_recipe("grpo_tiny_cpu_separated", [])))
    colocated = ParallelLayout(dp=2, engine_count=2, recompute="none")
    assert structural_reason(tiny, colocated) == (
        "DP2 x micro batch 16 needs 32 sequences per minibatch, which has 16 (idle ranks)"
    )
    odd = dataclasses.replace(
        inp, spec=dataclasses.replace(inp.spec, num_attention_heads=28, num_query_groups=4)
    )
    assert "layout.engine_tp=8: must divide model.num_attention_heads=28" in structural_reason(
        odd, base.with_(tp=4, dp=32, engine_tp=8, engine_count=32)
    )


def test_every_ranked_layout_round_trips_through_its_overrides():
    """`as_overrides` sets exactly the layout the search ranked (what peer_trl.py and users run)."""
    from megatron_rl.config.load import load_recipe

    recipe = load_recipe("grpo_qwen2.5-32b_32n8g", [])
    layouts = [cyc.layout for cyc in search(inputs_from_run(resolve(recipe)))["ranked"][:6]]
    layouts.append(layouts[0].with_(sequence_parallel=False, pp_layers=(14, 18, 18, 14), pp=4))
    for layout in layouts:
        again = load_recipe("grpo_tiny_cpu", layout.as_overrides())
        assert ParallelLayout.from_config(again.layout) == layout


def test_on_the_cpu_cluster_the_search_prefers_dp_to_tp_for_a_tiny_model():
    """gloo's ~1 ms per collective (cluster.allreduce_latency_us) makes trainer TP2 slower than DP2 on
    this machine for the tiny model; at NVLink latency the two are within a hair of each other."""
    from megatron_rl.config.load import load_recipe
    from megatron_rl.plan.cycle import cycle

    work = ["data.prompts_per_step=16", "algorithm.minibatches=1", "optim.micro_batch_size=16"]
    ranked = search(inputs_from_run(resolve(load_recipe("grpo_tiny_hf_cpu", work))))["ranked"]
    colocated = [c.layout for c in ranked if c.layout.colocated]
    assert (colocated[0].tp, colocated[0].dp) == (1, 2), [c.describe() for c in colocated]

    def trainer_s(latency_us: float, tp: int, dp: int) -> float:
        recipe = load_recipe("grpo_tiny_hf_cpu", [*work, f"cluster.allreduce_latency_us={latency_us}"])
        inp = inputs_from_run(resolve(recipe))
        lay = ParallelLayout.from_config(recipe.layout).with_(tp=tp, dp=dp)
        ph = cycle(inp, lay).phases
        return sum(ph[k] for k in ("ref_logprobs", "train_fwd_bwd"))

    assert trainer_s(1000, 2, 1) > trainer_s(1000, 1, 2) + 0.1  # TP pays ~30 collectives per microbatch
    assert abs(trainer_s(0, 2, 1) - trainer_s(0, 1, 2)) < 0.05
