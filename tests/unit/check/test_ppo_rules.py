"""PPO and learned reward models: `validate` refuses what cannot run, naming the key; the shipped PPO recipe
passes. The reward model's checkpoint here is a config.json alone (the rules read no weights)."""

from __future__ import annotations

import json

import pytest

from megatron_rl.check.ppo import tokenizer_difference
from megatron_rl.check.recipe import check_recipe
from megatron_rl.config.load import load_recipe


def _keys(recipe: str, *overrides: str) -> dict[str, str]:
    return {p.key: p.message for p in check_recipe(load_recipe(recipe, list(overrides)), read_data=False)}


def _reward_model(tmp_path, name="rm", vocab=17, arch="Qwen2ForSequenceClassification", labels=1, heads=4):
    d = tmp_path / name
    d.mkdir()
    conf = {
        "model_type": "qwen2", "architectures": [arch], "num_labels": labels, "vocab_size": vocab,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": heads,
        "num_key_value_heads": 2 if heads % 2 == 0 else 1, "head_dim": 64, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
    }  # fmt: skip
    if labels != 1:
        conf["id2label"] = {str(i): f"L{i}" for i in range(labels)}
    (d / "config.json").write_text(json.dumps(conf))
    return d


def test_the_ppo_recipe_validates():
    assert _keys("ppo_tiny_cpu") == {}


def test_a_critic_at_its_own_layout_validates():
    """critic.tp/pp other than the trainer's (trainer/model_groups.py): TP1 x DP2 and TP1 x PP2 beside the
    trainer's TP2, and a micro-batch size checked against the critic's own DP share."""
    assert _keys("ppo_tiny_cpu", "critic.tp=1", "critic.micro_batch_size=8") == {}
    assert _keys("ppo_tiny_cpu", "critic.tp=1", "critic.pp=2") == {}  # TP1 x PP2: DP1, the trainer's share
    problems = _keys("ppo_tiny_cpu", "critic.tp=1", "critic.micro_batch_size=16")
    assert "must divide each critic rank's 8 samples" in problems["critic.micro_batch_size"], problems
    # 0 takes the policy's, which fits the trainer's share but not the critic's smaller one
    problems = _keys("ppo_tiny_cpu", "critic.tp=1")
    assert "0 takes optim.micro_batch_size=16" in problems["critic.micro_batch_size"], problems


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["algorithm.gamma=0.9"], "algorithm.gamma", "is a PPO option"),
        (["algorithm.advantage_whiten=none"], "algorithm.advantage_whiten", "is a PPO option"),
        (["critic.lr=1e-5"], "critic.lr", "configures PPO's critic"),
        (["critic.critic_only_steps=2"], "critic.critic_only_steps", "configures PPO's critic"),
    ],
)
def test_ppo_options_under_grpo_are_refused(overrides, key, says):
    problems = _keys("grpo_tiny_cpu", *overrides)
    assert key in problems and says in problems[key], problems


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["critic.tp=3"], "critic.tp", "must divide the trainer's 2 ranks"),
        (["critic.pp=2"], "critic.pp", "critic.tp x critic.pp = 2 x 2 must divide the trainer's 2 ranks"),
        (
            ["model.num_layers=3", "critic.tp=1", "critic.pp=2"],
            "critic.pp",
            "does not divide model.num_layers=3",
        ),
        (
            ["critic.tp=1", "critic.micro_batch_size=1", "data.prompts_per_step=15"],
            "critic.tp",
            "2 data-parallel ranks and a minibatch has 15 samples: each rank needs an equal share",
        ),
        (["layout.tp=1", "layout.cp=2", "critic.pp=2"], "critic.pp", "without context or expert parallelism"),
        (
            ["critic.tp=1", "algorithm.minibatches=64"],
            "critic.tp",
            "2 data-parallel ranks and a minibatch has 1 samples: each rank needs an equal share",
        ),
        (["critic.critic_only_steps=60"], "critic.critic_only_steps", "never train"),
        (["algorithm.dynamic_sampling=true"], "algorithm.dynamic_sampling", "a GRPO notion"),
        (
            ["critic.micro_batch_size=5"],
            "critic.micro_batch_size",
            "must divide each critic rank's 16 samples",
        ),
        (["algorithm.gamma=1.5"], "algorithm.gamma", ""),
        (["algorithm.lam=-0.1"], "algorithm.lam", ""),
        (["algorithm.epochs=0"], "algorithm.epochs", ""),
        (["algorithm.advantage_whiten=mean"], "algorithm.advantage_whiten", ""),
        (["reward.kind=model"], "reward.model_checkpoint", "is empty and reward.kind=model"),
        (["reward.model_weight=0.5"], "reward.model_weight", "reward.model_checkpoint is empty"),
        (["critic.init=/nonexistent/rm"], "critic.init", "holds no config.json"),
        (["layout=separated_cpu"], "layout.placement", "is not run yet"),
    ],
)
def test_what_ppo_cannot_run_is_refused_by_key(overrides, key, says):
    problems = _keys("ppo_tiny_cpu", *overrides)
    assert key in problems and says in problems[key], problems


def test_a_reward_model_of_another_vocabulary_or_kind_is_refused(tmp_path):
    ok = _reward_model(tmp_path)
    assert _keys("ppo_tiny_cpu", f"reward.model_checkpoint={ok}", "reward.model_weight=0.5") == {}
    assert _keys("ppo_tiny_cpu", f"critic.init={ok}") == {}
    cases = {
        _reward_model(tmp_path, "vocab", vocab=100): "its tokenizer must be the policy's",
        _reward_model(tmp_path, "causal", arch="Qwen2ForCausalLM"): "not a *ForSequenceClassification",
        _reward_model(tmp_path, "labels", labels=3): "num_labels=3",
        _reward_model(tmp_path, "heads", heads=3): "layout.tp=2 does not divide",
    }
    for path, says in cases.items():
        for key in ("reward.model_checkpoint", "critic.init"):
            problems = _keys("ppo_tiny_cpu", f"{key}={path}")
            assert key in problems and says in problems[key], (path.name, key, problems)


def test_a_reward_model_read_here_is_needed_only_by_the_run(tmp_path):
    """A path this machine cannot see is a note (kind files) for `validate` on a laptop, and the plan assumes
    the policy's shape; the driver refuses it."""
    problems = check_recipe(
        load_recipe("ppo_tiny_cpu", ["reward.model_checkpoint=/no/such/rm"]), read_data=False
    )
    [p] = [p for p in problems if p.key == "reward.model_checkpoint"]
    assert p.kind == "files"


def _tokenizer(tmp_path, name, vocab, merges=(), added=()):
    d = tmp_path / name
    d.mkdir()
    body = {"model": {"type": "BPE", "vocab": vocab, "merges": list(merges)}, "added_tokens": list(added)}
    (d / "tokenizer.json").write_text(json.dumps(body))
    return str(d)


def test_tokenizers_are_compared_by_vocabulary_merges_and_special_ids(tmp_path):
    base = _tokenizer(tmp_path, "a", {"a": 0, "b": 1}, ["a b"], [{"content": "<eos>", "id": 2}])
    same = _tokenizer(tmp_path, "b", {"a": 0, "b": 1}, ["a b"], [{"content": "<eos>", "id": 2}])
    assert tokenizer_difference(base, same) == ""
    other_vocab = _tokenizer(tmp_path, "c", {"a": 1, "b": 0}, ["a b"], [{"content": "<eos>", "id": 2}])
    assert "vocab" in tokenizer_difference(base, other_vocab)
    other_merges = _tokenizer(tmp_path, "d", {"a": 0, "b": 1}, [], [{"content": "<eos>", "id": 2}])
    assert "merges" in tokenizer_difference(base, other_merges)
    moved = _tokenizer(tmp_path, "e", {"a": 0, "b": 1}, ["a b"], [{"content": "<eos>", "id": 3}])
    assert "'<eos>'" in tokenizer_difference(base, moved)
    assert tokenizer_difference(base, str(tmp_path / "missing")) == "one of them has no tokenizer.json"
    assert tokenizer_difference("", "") == ""  # two models of the synthetic task: nothing to compare
