"""In-place delivery after a level-2 sleep: every engine parameter must be written, or activation is
refused (VLLMEngine.update_weights_inplace uses `uncovered_params`)."""

import torch
from torch import nn

from megatron_rl.rollout.vllm_engine import uncovered_params


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
