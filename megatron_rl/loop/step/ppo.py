"""PPO's part of a step: the critic's values, per-token advantages by GAE, the value loss, and a learned
reward model's scores.

GRPO's baseline is the group mean (loop/step/rl_batch.py); PPO's is the critic's estimate of each state's
value, so every token gets its own advantage and a prompt needs only one sample. The critic scores the same
token ids the trainer trains on, on the same [B, T] grid as the log-probs, so the advantages, the old values
and the returns travel as per-token extras exactly like the old log-probs do.

Each DP rank computes the values and advantages of its own samples (`mine`); the batch-wide numbers
(whitening's mean and std, the explained variance) are sums reduced over the DP group's gloo twin, so every
rank whitens with the same statistics a single process would.

A learned reward model (reward.model_checkpoint) scores after generation, on the trainer's devices: each DP
rank scores its share and every rank receives every score (the advantages of any algorithm need them all).
"""

from __future__ import annotations

import torch

from megatron_rl.loop.step.rl_batch import gather_over_dp, shaped_rewards
from megatron_rl.rollout.types import Sample


def _all_reduce_sum(t: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)
    return t


def generated_mask(s: Sample) -> torch.Tensor:
    """1 on the tokens the model generated (a multi-turn trajectory's observations are 0)."""
    if s.loss_mask is None:
        return torch.ones(len(s.token_ids), device="cpu")
    return torch.tensor(s.loss_mask, dtype=torch.float32, device="cpu")


def critic_share(critic, everyone: list[int], idx: list[int]) -> list[int]:
    """The samples this rank's critic scores and trains on, of `everyone` (a minibatch's, or the step's): the
    trainer's DP share `idx` at the trainer's layout, else every critic.dp-th one from its own DP rank (the
    critic's DP split is not the trainer's at a layout of its own, trainer/model_groups.py)."""
    st = critic.state
    if st.groups is None:
        return idx
    return sorted(everyone)[st.dp_rank :: st.dp]


def critic_values(critic, samples: list[Sample], idx: list[int], cpu_group=None) -> dict[int, torch.Tensor]:
    """samples[i] -> the critic's value of the state before each of its completion tokens, for i in idx (this
    DP rank's share). Collective over the critic's model group. At a layout of its own the critic scores its
    own share of the step and the shares are exchanged over every rank (`cpu_group`), so any split finds
    them."""
    mine = critic_share(critic, list(range(len(samples))), idx)
    chosen = [samples[i] for i in mine]
    values = dict(zip(mine, critic.values([s.sequence for s in chosen], [s.prompt_len for s in chosen])))
    return values if critic.state.groups is None else gather_over_dp(values, cpu_group)


def own_layout_line(critic, trainer) -> str:
    """The start-up line of a critic at its own layout (critic.tp, critic.pp)."""
    c, t = critic.state, trainer
    return (
        f"critic: tp={c.tp} pp={c.pp} dp={c.dp} (its own layout, on the trainer's ranks at tp={t.tp} pp={t.pp} "
        f"dp={t.dp})"
    )


def critic_targets(critic, returns: dict[int, torch.Tensor], cpu_group=None) -> dict[int, torch.Tensor]:
    """The returns (GAE's, per DP share of the trainer) where the critic's shares can read them: as they are
    at the trainer's layout, exchanged over every rank (`cpu_group`) at a layout of its own."""
    return returns if critic.state.groups is None else gather_over_dp(returns, cpu_group)


def _grid(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, device="cpu")
    for b, r in enumerate(rows):
        out[b, : r.numel()] = r
    return out


def advantages(
    samples: list[Sample],
    idx: list[int],
    values: dict[int, torch.Tensor],
    algo,
    max_new_tokens: int,
    turn_penalty: float = 0.0,
    kl: dict[int, torch.Tensor] | None = None,
    dp_cpu_group=None,
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], dict[str, float]]:
    """(advantages, returns, metrics) per completion token of samples[i], i in idx.

    The sequence's shaped reward (rl_batch.py: over-long and turn penalties) lands on its last generated
    token; with `kl` (per-token KL to the reference, algorithm.kl_in_reward) kl_coef x it is taken off
    every generated token. GAE with algorithm.gamma and algorithm.lam over the generated tokens, then
    whitening (algorithm.advantage_whiten) with moments over every DP rank. Returns are not whitened: they
    are the critic's targets."""
    from megatron_rl.algorithms import (
        explained_variance_from,
        explained_variance_sums,
        gae_advantages,
        moments,
        token_rewards,
        whiten,
    )

    if not idx:
        raise ValueError("no samples on this DP rank: every rank needs a share of the batch")
    width = max(len(samples[i].token_ids) for i in idx)
    mask = _grid([generated_mask(samples[i]) for i in idx], width)
    vals = _grid([values[i] for i in idx], width)
    rewards = shaped_rewards(samples, algo, max_new_tokens, turn_penalty)[idx]
    kl_BT = _grid([kl[i] for i in idx], width) if kl is not None else None
    per_token = token_rewards(rewards, mask, kl_BT, algo.kl_coef if kl is not None else 0.0)
    adv, ret = gae_advantages(per_token, vals, mask, algo.gamma, algo.lam)
    raw = _all_reduce_sum(moments(adv, mask), dp_cpu_group)
    whitened = whiten(adv, mask, algo.advantage_whiten, raw)
    sums = _all_reduce_sum(explained_variance_sums(vals, ret, mask), dp_cpu_group)
    ev = explained_variance_from(sums)
    n_tok, s_r, s_r2, s_d, s_d2 = (float(x) for x in sums)
    n_tok = max(n_tok, 1.0)
    count = max(float(raw[0]), 1.0)
    ret_sum = _all_reduce_sum(torch.stack([(ret * mask).sum(), (vals * mask).sum()]).double(), dp_cpu_group)
    metrics = {
        "explained_variance": float(ev),
        # its two variances (population, over the step's generated tokens): a window of steps explains
        # 1 - sum(residual) / sum(returns) of its returns' variance, which a step of near-constant returns
        # (its own ratio unbounded) cannot swing
        "returns_variance": max(s_r2 / n_tok - (s_r / n_tok) ** 2, 0.0),
        "residual_variance": max(s_d2 / n_tok - (s_d / n_tok) ** 2, 0.0),
        "advantage_mean": float(raw[1]) / count,  # before whitening
        "returns_mean": float(ret_sum[0]) / count,
        "values_mean": float(ret_sum[1]) / count,
    }
    n = {i: len(samples[i].token_ids) for i in idx}
    return (
        {i: whitened[b, : n[i]].clone() for b, i in enumerate(idx)},
        {i: ret[b, : n[i]].clone() for b, i in enumerate(idx)},
        metrics,
    )


def critic_extras(
    samples, idx: list[int], keep, old_values: dict, returns: dict
) -> dict[str, list[torch.Tensor]]:
    """A minibatch's per-token tensors for the critic's update: old values, returns, and what the loss covers
    (the generated tokens of kept samples)."""
    return {
        "old_values": [old_values[i] for i in idx],
        "returns": [returns[i] for i in idx],
        "keep": [generated_mask(samples[i]) * float(keep[i]) for i in idx],
    }


def value_loss_fn(algo, max_new_tokens: int, normaliser: float):
    """The critic's loss_fn(values_BT, microbatch): the clipped value loss (algorithm.value_clip), aggregated
    like the policy's loss with the minibatch's global normaliser."""
    from megatron_rl.algorithms import value_loss

    norm = {"global_tokens": normaliser} if algo.loss_agg == "token-mean" else {"global_seqs": normaliser}

    def loss_fn(values_BT, mb):
        x = mb.extras
        return value_loss(
            values_BT, x["old_values"], x["returns"], mb.loss_mask_BT * x["keep"],
            clip=algo.value_clip, loss_agg=algo.loss_agg, max_len=max_new_tokens, **norm,
        )  # fmt: skip

    return loss_fn


def critic_metrics(outs: list[dict]) -> dict[str, float]:
    """The critic's update metrics over the step's minibatches, as step record keys: value_loss (the mean
    over its optimizer steps of the minibatch's loss), value_clip_fraction, critic_grad_norm and critic_lr.
    Each optimizer step's numbers are already its whole minibatch's, on every rank, every DP share and
    pipeline stage included (`Policy.train_step`)."""
    if not outs:
        return {}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    return {
        "value_loss": mean([o["loss"] for o in outs if "loss" in o]),
        "value_clip_fraction": mean([o.get("value_clip_fraction", 0.0) for o in outs]),
        "critic_grad_norm": mean([o["grad_norm"] for o in outs if "grad_norm" in o]),
        "critic_lr": outs[-1].get("lr", float("nan")),
    }


def token_kl(
    old: dict[int, torch.Tensor], ref: dict[int, torch.Tensor], estimator: str
) -> dict[int, torch.Tensor]:
    """Per-token KL estimates of this rank's samples (policy before the update vs the reference), for KL as a
    reward penalty (algorithm.kl_in_reward); `token_rewards` applies them on the generated tokens only."""
    from megatron_rl.algorithms import kl_estimate

    return {i: kl_estimate(old[i], ref[i], estimator) for i in old}


def model_score_metrics(samples: list[Sample]) -> dict[str, float]:
    """The reward model's mean score over the step (a step record key), when one scored."""
    scores = [s.model_score for s in samples if s.model_score is not None]
    return {"reward_model_mean": sum(scores) / len(scores)} if scores else {}


def reward_model_scores(rm, samples: list[Sample], idx: list[int], dp_cpu_group=None) -> dict[int, float]:
    """samples[i] -> the reward model's score of its prompt and completion, for every i of the step: each DP
    rank scores its share `idx`, and the shares are exchanged over the DP group's gloo twin."""
    chosen = [samples[i] for i in idx]
    scores = rm.scores([s.sequence for s in chosen]) if chosen else []
    return gather_over_dp(dict(zip(idx, scores)), dp_cpu_group)


def combine_rewards(samples: list[Sample], scores: dict[int, float], reward_cfg) -> None:
    """Each sample's reward becomes the recipe's weighted sum (in place): model_weight x the reward model's
    score, plus verifier_weight x the verifier's unless reward.kind=model (no verifier ran)."""
    verifier = 0.0 if reward_cfg.kind == "model" else reward_cfg.verifier_weight
    for i, s in enumerate(samples):
        s.model_score = float(scores[i])
        s.reward = verifier * s.reward + reward_cfg.model_weight * s.model_score
