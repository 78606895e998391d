"""Llama-3.1 RoPE scaling: the HF config carries it, it changes log-probs past the original context
(so a trainer that dropped it could not match HF), and megatron-core's frequencies equal HF's."""

from __future__ import annotations

from dataclasses import replace

import torch

from megatron_rl.models.tiny import hf_config, hf_model
from tests.helpers.specs import LLAMA31_TINY_SCALED


def _logprobs(model, seq):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)


def test_the_hf_config_carries_the_scaling():
    params = hf_config(LLAMA31_TINY_SCALED).rope_parameters
    assert params["rope_type"] == "llama3" and params["factor"] == 8.0
    assert params["original_max_position_embeddings"] == 8


def test_scaling_changes_logprobs_only_past_the_original_context():
    plain = replace(LLAMA31_TINY_SCALED, rope_scaling="none")
    seq = list(range(3, 17))  # 14 positions; the original context is 8
    a, b = _logprobs(hf_model(LLAMA31_TINY_SCALED, seed=1), seq), _logprobs(hf_model(plain, seed=1), seq)
    # Position 0 has no rotation at all; later positions move with the slowed frequencies.
    assert torch.allclose(a[0], b[0], atol=1e-6)
    assert (a[8:] - b[8:]).abs().max() > 1e-3


def test_megatron_frequencies_equal_hf():
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    spec = LLAMA31_TINY_SCALED
    rope = RotaryEmbedding(
        kv_channels=spec.head_dim,
        rotary_percent=1.0,
        rotary_base=int(spec.rope_theta),
        use_cpu_initialization=True,
    )

    class Model:  # what apply_rope_scaling touches of a GPTModel
        rotary_pos_emb = rope

    from megatron_rl.models.megatron import apply_rope_scaling

    apply_rope_scaling(Model, spec)
    hf_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config(spec), "cpu")
    assert torch.allclose(rope.inv_freq.float(), hf_inv.float(), rtol=1e-6, atol=0)
