"""Step metrics from the pieces of a step, and the few completions a step keeps to be read.

Besides rewards, tokens and throughput, a step records what `megatron-rl report` needs to say where the
devices sat idle (`generation.tail_s`: the batch waiting on its longest completion), how completions
ended (`completion_stats`: lengths and `stop_fraction`), the trainer's model FLOPs (for MFU), and whether
it can learn at all: what the rewards came back as (`reward.statuses`) and the share of groups whose
samples all got one reward (`reward.flat_group_fraction`: their advantages are 0; loop/record/signal.py).
"""

from __future__ import annotations

from collections import Counter

from megatron_rl.loop.step.collect import CollectStats
from megatron_rl.rollout.types import Sample


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def generation_tail_seconds(finish_s: list[float], call_s: float) -> float:
    """Batch-slot seconds left empty while a generate call waited on its longest completion.

    With N samples finishing at f_1..f_N in a call of T seconds, the share of the batch still running at
    time t is #{f_i > t} / N; the empty share integrates to T - mean(f). It is 0 when every completion
    runs to the end and approaches T when one long completion holds the engine alone.
    """
    if not finish_s:
        return 0.0
    return max(0.0, call_s - sum(finish_s) / len(finish_s))


def trainer_flops(spec, samples: list[Sample], forwards: int) -> float:
    """Model FLOPs of the trainer's step: `forwards` forward passes (3 per trained pass: forward and
    backward; 1 per log-prob pass) over every sequence, matmuls 2·P per token and causal attention
    2·L·q·S·(S+1) per sequence (the planner's convention, plan/flops.py). An MoE model's matmuls are
    its active parameters: each token runs through its top-k experts only."""
    matmul = spec.num_layers * spec.layer_params(active=True) + spec.vocab_size * spec.hidden_size
    total = 0.0
    for s in samples:
        seq = len(s.prompt_ids) + len(s.token_ids)
        total += 2.0 * matmul * seq + 2.0 * spec.num_layers * spec.q_size * seq * (seq + 1)
    return forwards * total


def prompt_digest(samples: list[Sample]) -> str:
    """A short hash of the step's prompts (token ids, prompt-major, one per group)."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for s in samples:
        if s.sample_index == 0:
            h.update(repr(s.prompt_ids).encode())
    return h.hexdigest()


def sample_digest(samples: list[Sample]) -> str:
    """A short hash of the step's completions: each sample's tokens and the version of each token (two
    runs that trained the same samples, drawn by the same versions, have the same digest)."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for s in samples:
        h.update(repr((s.prompt_index, s.sample_index, s.token_ids, s.versions)).encode())
    return h.hexdigest()


def flat_group_fraction(samples: list[Sample]) -> float:
    """The share of the step's groups (a prompt's samples) whose samples all got the same reward: their
    group-relative advantages are 0, so they teach the policy nothing (1.0: the whole step teaches nothing)."""
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.prompt_index, []).append(s.reward)
    if not groups:
        return 0.0
    return sum(max(r) - min(r) <= 1e-9 for r in groups.values()) / len(groups)


def kept_samples(step: int, samples: list[Sample], task, count: int) -> list[dict]:
    """`count` of the step's samples, spread over its groups (prompt-major order: one prompt each while
    there are prompts enough), as a person reads them: prompt and completion decoded by the task's
    tokenizer (`task.text`), with their reward and status. `logger.samples_per_step`; 0: none."""
    if count <= 0 or not samples:
        return []
    k = min(count, len(samples))
    picks = [i * len(samples) // k for i in range(k)]
    return [
        {
            "step": step,
            "prompt_index": s.prompt_index,
            "sample_index": s.sample_index,
            "reward": s.reward,
            "status": s.status,
            "finish_reason": s.finish_reason,
            "completion_tokens": len(s.token_ids),
            "version": s.version,
            **({"turns": s.turns, "error": s.error} if s.loss_mask is not None else {}),
            **({"model_score": s.model_score} if s.model_score is not None else {}),
            "prompt": task.text(s.prompt_ids),
            "completion": task.text(s.token_ids),
        }
        for s in (samples[i] for i in picks)
    ]


def completion_stats(samples: list[Sample]) -> dict:
    """Completion lengths and how completions ended: `stop_fraction` is the share that ended at a stop
    id (finish reason "stop"); the rest hit the length cap. A stop fraction near 0 with the mean near
    the cap means the engine never saw the model's end ids (models/checkpoint.py `stop_token_ids`)."""
    lengths = [len(s.token_ids) for s in samples]
    return {
        "completion_tokens_mean": _mean([float(n) for n in lengths]),
        "completion_tokens_max": max(lengths, default=0),
        "stop_fraction": _mean([float(s.finish_reason == "stop") for s in samples]),
    }


def turn_stats(samples: list[Sample], exact: bool) -> dict:
    """Multi-turn figures of the step (single-turn: one turn each, no environment): turns per trajectory,
    seconds the environments spent (summed over trajectories: they run in parallel, so this is work, not
    the step's wall time), the share of the trained sequences' tokens that came from observations, and
    `token_exact`: whether every trained sample's ids are the ones its engine produced, turn by turn."""
    turns = [s.turns for s in samples]
    every = sum(len(s.prompt_ids) + len(s.token_ids) for s in samples)
    return {
        "turns_mean": _mean([float(t) for t in turns]),
        "turns_max": max(turns, default=0),
        "env_seconds": float(sum(s.env_seconds for s in samples)),
        "env_token_fraction": sum(s.observation_tokens for s in samples) / every if every else 0.0,
        "token_exact": bool(exact),
        # the share of trajectories that passed at their first turn, and at a later one (after feedback)
        "solved_first_turn": _mean([float(s.status == "passed" and s.turns == 1) for s in samples]),
        "solved_after_feedback": _mean([float(s.status == "passed" and s.turns > 1) for s in samples]),
    }


def step_metrics(
    samples: list[Sample],
    stats: CollectStats,
    agreement: dict,
    train: list[dict],
    publication,
    run,
    spec,
    exact: bool = False,
) -> dict:
    """The step's record (`run`: the run's records, loop/record/records.py; `spec`: the model's, for the
    trainer's FLOPs; `exact`: the trainer's token check, loop/step/rl_batch.py `tokens_exact`)."""
    rewards = [s.reward for s in samples]
    gen_tokens = sum(s.generated_tokens for s in samples)
    m = sum(rewards) / len(rewards)
    phases_now = run.timer.stats
    gen_s = phases_now.get("generation").seconds if "generation" in phases_now else stats.generation_s
    train_s = sum(phases_now[p].seconds for p in ("train_fwd_bwd", "optimizer") if p in phases_now)
    versions = sorted({v for s in samples for v in s.versions} or {s.version for s in samples})
    cfg = run.recipe
    # Trained: forward + backward (3 forwards' worth); old and reference log-probs: 1 each when run.
    forwards = 3 + sum(1 for p in ("old_logprobs", "ref_logprobs") if p in phases_now)
    tails = [generation_tail_seconds(f, t) for f, t in zip(stats.finish_s, stats.call_s)]
    return {
        "version": versions[0] if len(versions) == 1 else versions,
        # Which prompts this step trained, in order: a resumed run must train the same ones (none lost,
        # none twice), whatever the engines had drawn ahead when it stopped (loop/placement/feed.py).
        "prompt_digest": prompt_digest(samples),
        "sample_digest": sample_digest(samples),
        "published_version": publication.version if publication is not None else None,
        "reward": {
            "mean": m,
            "std": (sum((r - m) ** 2 for r in rewards) / len(rewards)) ** 0.5,
            "min": min(rewards),
            "max": max(rewards),
            "statuses": dict(Counter(s.status for s in samples)),
            "flat_group_fraction": flat_group_fraction(samples),
        },
        **turn_stats(samples, exact),
        "tokens": {
            "generated": gen_tokens,
            "trained": gen_tokens,
            "observation": sum(s.observation_tokens for s in samples),
            "truncated_fraction": _mean([float(s.truncated) for s in samples]),
        },
        **completion_stats(samples),
        "throughput": {
            "generated_tokens_per_s": gen_tokens / gen_s if gen_s > 0 else 0.0,
            "trained_tokens_per_s": gen_tokens / train_s if train_s > 0 else 0.0,
            "samples_scored_per_s": stats.samples / max(stats.generation_s + stats.scoring_after_s, 1e-9),
            "scoring_hidden_fraction": 1.0 - stats.scoring_tail_s / max(stats.scoring_busy_s, 1e-9)
            if stats.scoring_busy_s > 0
            else 0.0,
        },
        # The reward pool after generation ended: until its last reward (`after_generation_s`, what the
        # planner calibrates scoring with), of which the step waited `exposed_s` (the `scoring` phase; the
        # rest hid behind the forwards that need no reward), and its sandboxes' summed seconds.
        "scoring": {
            "after_generation_s": stats.scoring_after_s,
            "exposed_s": stats.scoring_tail_s,
            "busy_s": stats.scoring_busy_s,
            "remote_retries": stats.remote_retries,  # reward fleet: samples sent again (reward/remote.py)
        },
        "generation": {
            # rollout.oversample: prompts drawn for this step and samples cut or dropped with their groups
            "prompts_drawn": stats.drawn_prompts,
            "samples_dropped": stats.dropped_samples,
            "tail_s": sum(tails),
            "calls": len(tails),
            "seconds": sum(stats.call_s),
            # multi-turn: the engine idle, every unfinished trajectory waiting on its environment
            "env_wait_s": stats.env_wait_s,
            # rollout.partial: cut samples this batch continued, samples it cut (carried to the next), and
            # the trained tokens drawn by an earlier batch (with an older version than this batch's)
            "samples_continued": stats.continued_samples,
            "samples_cut": stats.cut_samples,
            "tokens_from_earlier_batches": sum(v < versions[-1] for s in samples for v in s.versions),
        },
        "flops": {
            "trainer": trainer_flops(spec, samples, forwards),
            "peak_per_device": cfg.cluster.peak_tflops_bf16 * 1e12,
        },
        "logprob_agreement": agreement,
        # Means over the step's optimizer steps (one per minibatch); `lr` is the scheduled learning rate.
        "train": {
            k: _mean([t[k] for t in train if k in t])
            for k in (
                "loss",
                "pg_loss",
                "kl",
                "clip_fraction",
                "ratio_mean",
                "is_weight_mean",
                "grad_norm",
                "lr",
            )
            if any(k in t for t in train)
        },
        "publication": None
        if publication is None  # asynchronous: the last steps publish nothing (parallel/schedule.py)
        else {
            "activated": bool(publication.activated),
            "active_version": publication.active_version,
            "attempts": int(publication.attempts),
            "refused": list(publication.problems[:10]),  # every rank's problems, empty when activated
            "action": publication.action,
            "bytes_received": int(sum(publication.stats.recv.values())),
            "bytes_sent": int(sum(publication.stats.sent.values())),  # rank 0's (separated: to the engines)
            "bytes_local": int(publication.stats.local),
            "bytes_staged": int(publication.bytes_staged),
            "seconds": float(publication.seconds.get("total", 0.0)),
            # the log-prob probe of the version activated, before it served (loop/placement/probe.py); None without
            "probe": publication.probe,
        },
    }
