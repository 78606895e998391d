"""The random reward-model checkpoints (models/tiny.py write_hf_reward_model) are what transformers and our
importer take for a one-label *ForSequenceClassification model: a score head, no LM head."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from megatron_rl.models.hf import SCORE, all_hf_names
from megatron_rl.models.tiny import REWARD_PAD_TOKEN_ID, write_hf_checkpoint, write_hf_reward_model
from megatron_rl.trainer.hf_import import CheckpointError, HFCheckpoint, check_checkpoint
from tests.helpers.specs import QWEN3_MOE_TINY, SPECS

REWARD_SPECS = [SPECS["qwen2_tiny"], SPECS["llama_tiny_tied"], SPECS["qwen3_tiny"], QWEN3_MOE_TINY]
CLASSES = {
    "qwen2": "Qwen2ForSequenceClassification",
    "llama": "LlamaForSequenceClassification",
    "qwen3": "Qwen3ForSequenceClassification",
    "qwen3_moe": "Qwen3MoeForSequenceClassification",
}


@pytest.mark.parametrize("spec", REWARD_SPECS, ids=lambda s: s.name)
def test_reward_checkpoint_is_a_one_label_sequence_classifier(tmp_path, spec):
    from transformers import AutoModelForSequenceClassification

    path = write_hf_reward_model(spec, tmp_path / spec.name, seed=3)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [CLASSES[spec.family]]
    assert len(cfg["id2label"]) == 1
    assert cfg["pad_token_id"] == REWARD_PAD_TOKEN_ID and 0 <= REWARD_PAD_TOKEN_ID < spec.vocab_size
    tensors = load_file(path / "model.safetensors")
    assert set(tensors) == set(all_hf_names(spec, value_head=True))  # no lm_head, tied or not
    assert tensors[SCORE].shape == (1, spec.hidden_size) and tensors[SCORE].abs().min() > 0
    assert not torch.equal(tensors["model.norm.weight"], torch.ones(spec.hidden_size)), "norms perturbed"
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    assert type(model).__name__ == CLASSES[spec.family] and model.num_labels == 1
    with torch.no_grad():  # a batch of two: transformers needs the padding id for that
        scores = model(torch.tensor([[5, 6, 7, 8], [9, 10, 11, REWARD_PAD_TOKEN_ID]])).logits
    assert scores.shape == (2, 1) and scores.abs().max() > 1e-3
    check_checkpoint(HFCheckpoint.open(path), spec, value_head=True)  # the importer takes it as it is


def test_reward_checkpoints_are_seeded(tmp_path):
    spec = SPECS["qwen2_tiny"]
    a = load_file(write_hf_reward_model(spec, tmp_path / "a", seed=1) / "model.safetensors")
    b = load_file(write_hf_reward_model(spec, tmp_path / "b", seed=1) / "model.safetensors")
    c = load_file(write_hf_reward_model(spec, tmp_path / "c", seed=2) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a[SCORE], c[SCORE])


def test_policy_and_reward_checkpoints_are_not_interchangeable(tmp_path):
    """A reward model has no LM head for a policy; a causal LM has no score head for a value model."""
    spec = SPECS["qwen2_tiny"]
    reward = HFCheckpoint.open(write_hf_reward_model(spec, tmp_path / "reward"))
    causal = HFCheckpoint.open(write_hf_checkpoint(spec, tmp_path / "causal"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        check_checkpoint(reward, spec)
    with pytest.raises(CheckpointError, match=SCORE):
        check_checkpoint(causal, spec, value_head=True)
