"""The rules of PPO's critic and of a learned reward model: what cannot run, named by its key.

Part of the one recipe check (check/rules.py RULES). GRPO takes none of PPO's keys (a recipe that sets
them under algorithm.name=grpo would silently ignore them); the critic runs on the trainer's ranks, at
the trainer's layout or its own (critic.tp, critic.pp: trainer/model_groups.py);
a reward model and a critic started from one must read the policy's tokens (the same tokenizer), and must
be sequence-classification checkpoints with one label.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from megatron_rl.check.ranges import get_key
from megatron_rl.config.problem import Problem
from megatron_rl.config.schema import AlgorithmConfig, CriticConfig, RewardConfig
from megatron_rl.parallel import rules

PPO_ALGORITHM_KEYS = ("gamma", "lam", "value_clip", "advantage_whiten")


def _problem(run, key: str, message: str, kind: str = "recipe") -> Problem:
    return Problem(key, get_key(run.recipe, key), message, kind)


def ppo(run) -> list[Problem]:
    """PPO's options under GRPO, the critic's layout and steps, and the algorithm's exclusions."""
    cfg, out = run.recipe, []
    alg, critic = cfg.algorithm, cfg.critic

    def bad(key: str, message: str, kind: str = "recipe") -> None:
        out.append(_problem(run, key, message, kind))

    if alg.name != "ppo":
        defaults_a, defaults_c = AlgorithmConfig(), CriticConfig()
        for k in PPO_ALGORITHM_KEYS:
            if getattr(alg, k) != getattr(defaults_a, k):
                bad(
                    f"algorithm.{k}",
                    f"is a PPO option and this recipe runs {alg.name}: set algorithm.name=ppo, or drop it",
                )
        for f in fields(CriticConfig):
            if getattr(critic, f.name) != getattr(defaults_c, f.name):
                bad(f"critic.{f.name}", f"configures PPO's critic and this recipe runs {alg.name}: set "
                    "algorithm.name=ppo, or drop it")  # fmt: skip
        return out
    lay = run.layout
    if not lay.colocated:
        bad("layout.placement", "separated with algorithm.name=ppo is not run yet (the critic has been run "
            "colocated only); use layout.placement=colocated. The planner still models it", "driver")  # fmt: skip
    out += critic_layout_problems(run)
    if critic.critic_only_steps >= cfg.steps:
        bad("critic.critic_only_steps", f"must be below steps={cfg.steps}: the policy would never train")
    if alg.dynamic_sampling:
        bad("algorithm.dynamic_sampling", "keeps groups whose rewards differ, a GRPO notion (PPO's baseline is "
            "the critic, and a prompt needs one sample): turn it off with algorithm.name=ppo")  # fmt: skip
    spec = run.critic_spec
    if spec is not None and critic.init != "policy":
        out += side_model_problems(run, critic.init, "critic.init")
    return out


def critic_sizes(run) -> tuple[int, int]:
    """The critic's TP and PP: critic.tp and critic.pp, the trainer's where 0."""
    c, lay = run.recipe.critic, run.layout
    return c.tp or lay.tp, c.pp or lay.pp


def critic_dp(run) -> int:
    """The critic's data-parallel size: the trainer's ranks over critic.tp x critic.pp (0 when they do not
    divide them; critic_split_problems says so)."""
    c = run.recipe.critic
    return run.layout.model_dp(c.tp, c.pp)


def critic_split_problems(run) -> list[Problem]:
    """What a critic's layout asks of the trainer's ranks and the batch, no model shape needed (so `validate`
    checks it even when the checkpoint is unreadable here): critic.tp x critic.pp divides the ranks, each
    critic DP rank gets an equal share of a minibatch, and its micro-batch size divides that share."""
    cfg, c, lay = run.recipe, run.recipe.critic, run.layout
    out: list[Problem] = []
    tp, pp = critic_sizes(run)
    key = "critic.tp" if tp != lay.tp else "critic.pp"
    own_layout = (tp, pp) != (lay.tp, lay.pp)
    if own_layout and (lay.cp > 1 or lay.ep > 1):  # its own groups are built for neither (model_groups.py)
        out.append(_problem(run, key, f"a critic at its own layout needs the trainer without context or expert "
                            f"parallelism (layout.cp={lay.cp}, layout.ep={lay.ep}); use critic.tp=0 and "
                            "critic.pp=0"))  # fmt: skip
        return out
    world, dp = lay.trainer_world, critic_dp(run)
    if not dp:
        out.append(_problem(run, key, f"critic.tp x critic.pp = {tp} x {pp} must divide the trainer's {world} "
                            "ranks (the critic runs on them at its own layout)"))  # fmt: skip
        return out
    per_minibatch = cfg.data.prompts_per_step * cfg.rollout.samples_per_prompt // cfg.algorithm.minibatches
    if own_layout and (per_minibatch < dp or per_minibatch % dp):
        out.append(_problem(run, key, f"gives the critic {dp} data-parallel ranks and a minibatch has "
                            f"{per_minibatch} samples: each rank needs an equal share; make the minibatch a "
                            "multiple of it (data.prompts_per_step, rollout.samples_per_prompt, "
                            "algorithm.minibatches)"))  # fmt: skip
        return out
    # the critic's micro-batch size (0: the policy's) against its own DP share; at the trainer's layout and
    # size the trainer's rule already covers it
    mbs = c.micro_batch_size or cfg.optim.micro_batch_size
    per_rank = per_minibatch // max(dp, 1)
    if (c.micro_batch_size or own_layout) and per_rank and per_rank % mbs:
        taken = "" if c.micro_batch_size else f" (0 takes optim.micro_batch_size={mbs}: set this key)"
        message = f"must divide each critic rank's {per_rank} samples of a minibatch{taken}"
        out.append(_problem(run, "critic.micro_batch_size", message))
    return out


def critic_layout_problems(run) -> list[Problem]:
    """critic.tp and critic.pp: a layout of the critic's own on the trainer's ranks (trainer/model_groups.py)
    must split the trainer's ranks and the critic's model, give every critic rank samples, and be dense
    beside a trainer without context or expert parallelism (those groups are the trainer's alone)."""
    c, lay = run.recipe.critic, run.layout
    out = critic_split_problems(run)
    tp, pp = critic_sizes(run)
    if (tp, pp) == (lay.tp, lay.pp) or any(p.key in ("critic.tp", "critic.pp") for p in out):
        return out
    spec = run.critic_spec or run.spec
    if spec.is_moe:
        key = "critic.tp" if tp != lay.tp else "critic.pp"
        out.append(_problem(run, key, "a critic at its own layout must be dense (its own groups have no expert "
                            "parallelism): this critic is a mixture of experts; use critic.tp=0 and critic.pp=0"))  # fmt: skip
    # the model-shape rules of any trainer layout (parallel/rules.py), at the critic's, named by its keys
    for p in rules.trainer_problems(lay.for_model(c.tp, c.pp), spec):
        where = "critic.pp" if p.key.startswith("layout.pp") else "critic.tp"
        out.append(
            _problem(run, where, f"at the critic's layout tp={tp} pp={pp}: {p.key}={p.value} {p.message}")
        )
    return out


def reward_model(run) -> list[Problem]:
    """A learned reward model: its checkpoint, its tokenizer against the policy's, and the weights."""
    cfg, out = run.recipe, []
    r = cfg.reward
    defaults = RewardConfig()
    if r.kind == "model" and not r.model_checkpoint:
        out.append(_problem(run, "reward.model_checkpoint", "is empty and reward.kind=model: name an HF "
                            "*ForSequenceClassification checkpoint (one label) to score with"))  # fmt: skip
    if not r.model_checkpoint:
        for k in ("model_weight", "verifier_weight"):
            if getattr(r, k) != getattr(defaults, k):
                out.append(_problem(run, f"reward.{k}", "weighs a reward model's score against the verifier's, "
                                    "and reward.model_checkpoint is empty: set it, or drop this key"))  # fmt: skip
        return out
    if r.kind == "model" and r.verifier_weight != defaults.verifier_weight:
        out.append(_problem(run, "reward.verifier_weight", "has no verifier to weigh with reward.kind=model; "
                            "set reward.kind=sandbox (or function) to combine the two"))  # fmt: skip
    if not run.layout.colocated:
        out.append(_problem(run, "layout.placement", "separated with a reward model is not run yet (it has been "
                            "run colocated only); use layout.placement=colocated. The planner still models it",
                            "driver"))  # fmt: skip
    if cfg.algorithm.dynamic_sampling:
        out.append(_problem(run, "algorithm.dynamic_sampling", "filters groups by the verifier's rewards before "
                            "the reward model scores them on the trainer: turn one of them off"))  # fmt: skip
    out += side_model_problems(run, r.model_checkpoint, "reward.model_checkpoint")
    return out


def side_model_problems(run, hf_dir: str, key: str) -> list[Problem]:
    """A sequence-classification checkpoint beside the policy: readable here (else a note of kind files),
    one label, the policy's vocabulary and tokenizer, a shape the trainer's TP splits."""
    root = Path(hf_dir)
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        return [Problem(key, hf_dir, "holds no config.json here (an HF *ForSequenceClassification directory is "
                        "expected; the plan assumed the policy's shape)", "files")]  # fmt: skip
    try:
        conf = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        return [Problem(key, hf_dir, f"config.json does not parse: {e}")]
    out = []
    arch = [a for a in conf.get("architectures") or [] if isinstance(a, str)]
    labels = conf.get("num_labels", len(conf.get("id2label") or {}) or None)
    if arch and not any(a.endswith("ForSequenceClassification") for a in arch):
        out.append(Problem(key, hf_dir, f"is a {arch[0]}, not a *ForSequenceClassification checkpoint (a reward "
                           "model with a score head)"))  # fmt: skip
    elif labels not in (None, 1):
        out.append(
            Problem(key, hf_dir, f"has num_labels={labels}; a reward model gives one score (num_labels=1)")
        )
    spec = run.critic_spec if key == "critic.init" else run.reward_spec
    policy_vocab = run.spec.vocab_size
    if spec is not None and spec.vocab_size != policy_vocab:
        out.append(Problem(key, hf_dir, f"has vocab_size={spec.vocab_size} and the policy {policy_vocab}: it must read "
                           "the policy's tokens, so its tokenizer must be the policy's"))  # fmt: skip
    else:
        differs = tokenizer_difference(run.recipe.model.hf_checkpoint, hf_dir)
        if differs:
            out.append(Problem(key, hf_dir, f"has another tokenizer than the policy's ({differs}): it would score "
                               "token ids that mean other text; use a reward model trained on the policy's tokenizer"))  # fmt: skip
    if spec is not None:
        # the reward model runs at the trainer's layout; the critic at its own (critic.tp/pp, 0 = the trainer's)
        critic = key == "critic.init"
        tp, pp = critic_sizes(run) if critic else (run.layout.tp, run.layout.pp)
        at = "critic.tp" if critic and run.recipe.critic.tp else "layout.tp"
        for what, n in (
            ("num_attention_heads", spec.num_attention_heads),
            ("num_query_groups", spec.num_query_groups),
        ):
            if n % tp:
                out.append(Problem(key, hf_dir, f"has {what}={n}, which {at}={tp} does not divide (the TP it "
                                   "runs at)"))  # fmt: skip
        if spec.num_layers < pp:
            out.append(Problem(key, hf_dir, f"has {spec.num_layers} layers, fewer than its pp={pp}"))
    return out


def tokenizer_difference(policy_dir: str, other_dir: str) -> str:
    """How two checkpoints' tokenizers differ ("" when they agree, or when neither has a tokenizer file to
    compare: a model trained from scratch on the synthetic task's characters). Compared: the vocabulary and
    merges of tokenizer.json, then vocab.json, then the special tokens' ids."""

    def load(d: str, name: str):
        p = Path(d) / name if d else None
        if p is None or not p.is_file():
            return None
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return "unreadable"

    mine, theirs = load(policy_dir, "tokenizer.json"), load(other_dir, "tokenizer.json")
    if mine is None and theirs is None:
        mine, theirs = load(policy_dir, "vocab.json"), load(other_dir, "vocab.json")
        return "" if mine == theirs else "vocab.json differs"
    if (mine is None) != (theirs is None):
        return "one of them has no tokenizer.json"
    if mine == "unreadable" or theirs == "unreadable":
        return "a tokenizer.json does not parse"
    for part in ("vocab", "merges"):
        if (mine.get("model") or {}).get(part) != (theirs.get("model") or {}).get(part):
            return f"tokenizer.json's {part} differ"
    special = {t.get("content"): t.get("id") for t in mine.get("added_tokens") or []}
    other = {t.get("content"): t.get("id") for t in theirs.get("added_tokens") or []}
    shared = set(special) & set(other)
    moved = sorted(t for t in shared if special[t] != other[t])
    if moved:
        return f"special token {moved[0]!r} has id {special[moved[0]]} in the policy's and {other[moved[0]]} in it"
    return ""
