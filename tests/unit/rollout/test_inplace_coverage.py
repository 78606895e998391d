"""In-place delivery after a level-2 sleep: every engine parameter must be written, or activation is
refused (VLLMEngine.update_weights_inplace uses `uncovered_params`)."""

import torch
from torch import nn

from megatron_rl.rollout.engine_weights import uncovered_params


class TinyDecoder(nn.Module):  # stands in for vLLM's model: its named_parameters(), tied head included
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8, bias=False)])
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied: one parameter, listed once
        self.register_buffer("cos_sin_cache", torch.zeros(4))  # a buffer, not a weight to publish


def test_a_publication_of_every_parameter_covers_the_engine():
    params = dict(TinyDecoder().named_parameters())
    assert "lm_head.weight" not in params and "cos_sin_cache" not in params
    assert uncovered_params(params, iter(params)) == []
    assert uncovered_params(params, [*params, "extra.weight"]) == []  # unknown names are refused elsewhere


def test_what_the_publication_leaves_out_is_named():
    params = dict(TinyDecoder().named_parameters())
    incoming = [n for n in params if n not in ("norm.bias", "layers.0.bias")]
    assert uncovered_params(params, incoming) == ["layers.0.bias", "norm.bias"]
    assert uncovered_params(params, []) == sorted(params)


def _engine_over(model, weights_valid):
    """The real VLLMEngine.update_weights_inplace over a real module. In-place delivery needs vLLM's GPU
    build (the CPU build repacks its linear weights), so only the path to the live model is stood in."""
    from types import SimpleNamespace as NS

    from megatron_rl.rollout.vllm_engine import VLLMEngine

    eng = VLLMEngine.__new__(VLLMEngine)
    eng.on_gpu, eng._streaming, eng.version, eng._weights_valid = True, False, 1, weights_valid
    eng._engine = NS(model_executor=NS(driver_worker=NS(worker=NS(model_runner=NS(model=model)))))
    return eng


def test_activation_after_discarded_weights_refuses_a_partial_publication():
    import pytest

    model = TinyDecoder()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    partial = [(n, torch.ones_like(p)) for n, p in model.named_parameters() if n != "norm.weight"]
    eng = _engine_over(model, weights_valid=False)
    assert not eng.holds_weights
    with pytest.raises(RuntimeError, match=r"does not write 1 of its parameters.*'norm.weight'"):
        eng.update_weights_inplace(partial, version=2)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters()), "nothing is written"
    assert eng.version == 1 and not eng.holds_weights


class TinyFusedMoE(nn.Module):  # vLLM's FusedMoE holds every expert of a layer in one 3-D parameter
    def __init__(self, experts=4):
        super().__init__()
        self.w13_weight = nn.Parameter(torch.zeros(experts, 6, 8))
        self.w2_weight = nn.Parameter(torch.zeros(experts, 8, 3))
        self.gate = nn.Linear(8, experts, bias=False)


def test_per_expert_slices_cover_a_fused_moe_parameter_only_when_every_expert_arrives():
    params = dict(TinyFusedMoE().named_parameters())
    every = ["gate.weight"] + [f"{w}[{e}]" for w in ("w13_weight", "w2_weight") for e in range(4)]
    assert uncovered_params(params, every) == []
    assert uncovered_params(params, [n for n in every if n != "w2_weight[3]"]) == ["w2_weight"]
    # An index past the experts does not stand in for a missing one.
    assert uncovered_params(params, [n.replace("[3]", "[4]") for n in every]) == ["w13_weight", "w2_weight"]


def test_in_place_delivery_writes_each_expert_into_its_slice_and_refuses_a_wrong_one(monkeypatch):
    import pytest

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # the copies' GPU sync, absent on CPU
    from types import SimpleNamespace as NS

    model = TinyFusedMoE()
    eng = _engine_over(model, weights_valid=True)
    eng.llm = NS(reset_prefix_cache=lambda: True)  # vLLM's prefix cache, reset after every publication
    eng.update_weights_inplace(
        [("w13_weight[2]", torch.full((6, 8), 2.0)), ("w2_weight[0]", torch.ones(8, 3))], 2
    )
    assert torch.equal(model.w13_weight[2], torch.full((6, 8), 2.0)) and model.w13_weight[1].abs().sum() == 0
    assert torch.equal(model.w2_weight[0], torch.ones(8, 3)) and eng.version == 2
    before = model.w13_weight.detach().clone()
    with pytest.raises(KeyError, match="outside the engine's 4 experts"):
        eng.update_weights_inplace(
            [("w13_weight[1]", torch.ones(6, 8)), ("w13_weight[9]", torch.ones(6, 8))], 3
        )
    with pytest.raises(ValueError, match=r"w13_weight\[1\]: got shape \[6, 3\]"):
        eng.update_weights_inplace([("w13_weight[1]", torch.ones(6, 3))], 3)
    assert torch.equal(model.w13_weight, before) and eng.version == 2, "nothing is written"
