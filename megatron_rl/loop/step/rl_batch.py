"""One step's scored samples -> advantages -> per-DP-rank minibatches with their per-token tensors.

Every rank holds the whole step's samples (they are small: token ids and a few floats), so global
normalisers (tokens or sequences of a minibatch over all DP ranks) are computed locally and
identically everywhere, with no extra collective.

Host bookkeeping: every tensor here is made on the host (`device="cpu"`, said explicitly: the
trainer moves what it needs to its device, trainer/batch.py).

Sample order is prompt-major (the n samples of a prompt adjacent), which group advantages need.
The assignment to DP ranks and minibatches comes from a permutation seeded by (seed, step), so it
is the same on every rank and after a resume.
"""

from __future__ import annotations

import torch

from megatron_rl.algorithms import group_advantages, loss_normalizer, overlong_penalty
from megatron_rl.rollout.types import Sample


def shaped_rewards(
    samples: list[Sample], algo, max_new_tokens: int, turn_penalty: float = 0.0
) -> torch.Tensor:
    """Rewards [G], with the over-long length penalty added when the recipe asks for it, and with
    `rollout.turn_penalty` (multi-turn shaping, off at 0) taken off for each turn after the first."""
    r = torch.tensor([s.reward for s in samples], dtype=torch.float32, device="cpu")
    if turn_penalty:
        extra = [max(s.turns - 1, 0) for s in samples]
        r = r - turn_penalty * torch.tensor(extra, dtype=torch.float32, device="cpu")
    if algo.overlong == "penalty" and algo.overlong_penalty_tokens > 0:
        lengths = torch.tensor([len(s.token_ids) for s in samples], dtype=torch.float32, device="cpu")
        r = r + overlong_penalty(lengths, max_new_tokens, algo.overlong_penalty_tokens)
    return r


def assign(num_samples: int, dp: int, minibatches: int, seed: int, step: int) -> list[list[list[int]]]:
    """[minibatch][dp_rank] -> sample indices; identical on every rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    order = torch.randperm(num_samples, generator=g, device="cpu").tolist()
    per_mb = num_samples // minibatches
    out = []
    for j in range(minibatches):
        chunk = order[j * per_mb : (j + 1) * per_mb]
        per_rank = len(chunk) // dp
        out.append([sorted(chunk[d * per_rank : (d + 1) * per_rank]) for d in range(dp)])
    return out


def loss_mask_keep(samples: list[Sample], algo) -> list[float]:
    """Per-sample 0/1: over-long (truncated) samples are left out of the loss with overlong=mask."""
    return [0.0 if (algo.overlong == "mask" and s.truncated) else 1.0 for s in samples]


def global_normaliser(samples: list[Sample], indices: list[int], keep: list[float], mode: str) -> float:
    """The minibatch's loss denominator over all DP ranks (tokens or sequences with a valid token): the
    tokens the model generated, a multi-turn trajectory's observations left out."""
    lengths = [len(samples[i].token_ids) if keep[i] else 0 for i in indices]
    mask = torch.zeros(len(indices), max(max(lengths, default=1), 1), device="cpu")
    for b, (i, n) in enumerate(zip(indices, lengths)):
        if n:
            mask[b, :n] = torch.tensor(samples[i].generated_mask, dtype=torch.float32, device="cpu")
    return float(loss_normalizer(mask, mode))


def kl_sums(
    old: dict[int, torch.Tensor],
    ref: dict[int, torch.Tensor],
    estimator: str,
    dp_cpu_group=None,
    samples: list[Sample] | None = None,
) -> dict:
    """Per-sample sum of the KL estimate (policy vs reference) over its generated tokens (a multi-turn
    trajectory's observations are not the policy's: `samples` gives their masks), for every sample of the
    step (each DP rank computed its own samples; they are exchanged as host objects over the DP group's
    gloo twin, `Processes.dp_cpu_group`)."""
    from megatron_rl.algorithms import kl_estimate

    def mask(i: int) -> torch.Tensor | float:
        if samples is None or samples[i].loss_mask is None:
            return 1.0
        return torch.tensor(samples[i].loss_mask, dtype=torch.float32, device="cpu")

    return gather_over_dp(
        {i: float((kl_estimate(old[i], ref[i], estimator) * mask(i)).sum()) for i in old}, dp_cpu_group
    )


def gather_parts(local, cpu_group=None) -> list:
    """Every rank's `local` (a host object), in rank order, on every rank of the gloo group `cpu_group`;
    [local] without a process group or alone in it."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size(cpu_group) > 1:
        parts: list = [None] * dist.get_world_size(cpu_group)
        dist.all_gather_object(parts, local, group=cpu_group)
        return parts
    return [local]


def gather_over_dp(local: dict, dp_cpu_group=None) -> dict:
    """Every DP rank's dict (sample index -> a host value for its own samples) merged, on every rank, over
    the DP group's gloo twin (`Processes.dp_cpu_group`)."""
    return {k: v for p in gather_parts(local, dp_cpu_group) for k, v in (p or {}).items()}


def advantages_with_kl(
    samples, n: int, algo, max_new_tokens: int, kl_per_sample: dict | None, turn_penalty: float = 0.0
) -> torch.Tensor:
    """Group advantages over whole trajectories (one reward each); with `algorithm.kl_in_reward`, of
    rewards minus kl_coef x the sample's KL sum."""
    rewards = shaped_rewards(samples, algo, max_new_tokens, turn_penalty)
    if kl_per_sample is not None:
        rewards = rewards - algo.kl_coef * torch.tensor(
            [kl_per_sample[i] for i in range(len(samples))], device="cpu"
        )
    return group_advantages(rewards, n, std_norm=algo.advantage_std_norm)


def minibatch_extras(
    samples, idx: list[int], adv, keep, old: dict, ref: dict
) -> dict[str, list[torch.Tensor]]:
    """Per-completion-token tensors of a minibatch's samples, laid on the trainer's [B, T] grid. `keep`
    is 0 on a multi-turn trajectory's observation tokens: the loss covers what the model generated. `adv`:
    a sample's advantage (GRPO, a tensor [G]) or its tokens' (PPO, sample index -> a 1-D tensor)."""

    def per_token(i: int, value: float) -> torch.Tensor:
        return torch.full((len(samples[i].token_ids),), float(value), device="cpu")

    def kept(i: int) -> torch.Tensor:
        if samples[i].loss_mask is None:
            return per_token(i, keep[i])
        return torch.tensor(samples[i].loss_mask, dtype=torch.float32, device="cpu") * float(keep[i])

    def advantage(i: int) -> torch.Tensor:  # GRPO: one per sample; PPO: one per token (loop/step/ppo.py)
        a = adv[i]
        return a.float() if isinstance(a, torch.Tensor) and a.dim() == 1 else per_token(i, float(a))

    extras = {
        "adv": [advantage(i) for i in idx],
        "keep": [kept(i) for i in idx],
        "rollout": [torch.tensor(samples[i].logprobs, device="cpu") for i in idx],
    }
    if old:  # empty when the update's own forward stands in for them (algorithms/old_policy.py)
        extras["old"] = [old[i] for i in idx]
    if ref:
        extras["ref"] = [ref[i] for i in idx]
    return extras


def grpo_loss_fn(algo, max_new_tokens: int, normaliser: float, old_from_forward: bool = False):
    """The trainer's loss_fn(logprobs_BT, microbatch) for one minibatch: clipped surrogate + KL term
    (unless the KL went into the rewards), aggregated with the minibatch's global normaliser.

    `old_from_forward`: the batch is exactly on-policy and this is its only update, so the old
    log-probs are this forward's own, detached (algorithms/old_policy.py); the microbatch must then
    carry none, so a driver that forgot to pass recomputed ones fails instead of training on these."""
    from megatron_rl.algorithms import grpo_loss

    norm = {"global_tokens": normaliser} if algo.loss_agg == "token-mean" else {"global_seqs": normaliser}
    kl_coef = 0.0 if algo.kl_in_reward else algo.kl_coef

    def loss_fn(lp_BT, mb):
        x = mb.extras
        if old_from_forward == ("old" in x):
            raise ValueError(
                "old log-probs given for an on-policy update"
                if old_from_forward
                else "no old log-probs given"
            )
        old_BT = lp_BT.detach() if old_from_forward else x["old"]
        return grpo_loss(
            lp_BT, old_BT, x["adv"], mb.loss_mask_BT * x["keep"],
            clip_low=algo.clip_low, clip_high=algo.clip_high,
            ref_logprobs_BT=x.get("ref"), kl_coef=kl_coef, kl_estimator=algo.kl_estimator,
            loss_agg=algo.loss_agg, max_len=max_new_tokens,
            rollout_logprobs_BT=x["rollout"], truncated_is_cap=algo.truncated_is_cap, **norm,
        )  # fmt: skip

    return loss_fn


def scored(model, samples: list[Sample], idx: list[int], temperature: float, replay: bool) -> dict:
    """samples[i] -> its completion's log-probs under `model` (the policy, or the frozen reference), for i
    in idx (this DP rank's share), teacher-forced on the engine's exact tokens; with routing replay, through
    the experts the engine routed each token to. Collective over the model's group."""
    from megatron_rl.trainer.replay import routes_of

    chosen = [samples[i] for i in idx]
    values = model.logprobs(
        [s.sequence for s in chosen],
        [s.prompt_len for s in chosen],
        temperature=temperature,
        routes=routes_of(samples, idx, replay),
    )
    return dict(zip(idx, values))


def engine_logprobs(samples: list[Sample], idx: list[int]) -> dict:
    """samples[i] -> the engine's own sampling log-probs (algorithm.old_logprobs=engine)."""
    return {i: torch.tensor(samples[i].logprobs, dtype=torch.float32, device="cpu") for i in idx}


def share_agreement(
    samples: list[Sample], threshold: float, version: int, idx: list[int], trainer_logprobs
) -> dict:
    """The engine-vs-trainer agreement of samples[i] for i in idx (rollout/logprob_check.py `compare`),
    on the tokens of `version`, the batch's newest."""
    from megatron_rl.rollout.logprob_check import compare

    return compare([samples[i] for i in idx], trainer_logprobs, threshold, version)


def tokens_exact(samples: list[Sample], trained: dict[int, list[int]], cpu_group=None) -> bool:
    """True when, on every trainer rank, every sample's trained ids (`trained`: sample index -> the ids this
    rank gave the trainer) equal what its engine reported it ran and produced at each turn
    (rollout/types.py `token_exact`). A rank with no sample to check counts as exact; a sample without the
    engine's record does not."""
    import torch.distributed as dist

    from megatron_rl.rollout.types import token_exact

    ok = torch.tensor([float(all(token_exact(samples[i], ids) for i, ids in trained.items()))], device="cpu")
    if dist.is_initialized() and dist.get_world_size(cpu_group) > 1:
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=cpu_group)
    return bool(ok.item() == 1.0)


def mismatch_message(step: int, samples: list[Sample], trained: dict[int, list[int]]) -> str:
    """The error that ends a run whose trainer ids differ from its engines' (`tokens_exact` False)."""
    from megatron_rl.rollout.types import token_exact

    bad = [i for i, ids in trained.items() if not token_exact(samples[i], ids)]
    where = ""
    if bad:
        s = samples[bad[0]]
        why = "no record of the engine's view" if not s.engine_spans else "ids that differ from it"
        where = f" (sample {s.prompt_index}/{s.sample_index} of this rank: {why}; {len(bad)} on this rank)"
    return (
        f"step {step}: the trainer's token ids are not the ones the engines ran and produced{where}; training "
        "on them would train on tokens the policy never wrote (re-encoded text, a dropped separator). The step "
        "is not trained and the last checkpoint stays the newest: report it with outputs/<run>/log.txt"
    )
