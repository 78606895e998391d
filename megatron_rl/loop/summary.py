"""Step metrics from the pieces of a step, and the end-of-run reward summary."""

from __future__ import annotations

from collections import Counter

from megatron_rl.loop.collect import CollectStats
from megatron_rl.loop.rl_batch import ScoredSample


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def step_metrics(
    samples: list[ScoredSample], stats: CollectStats, agreement: dict, train: list[dict], publication, run
) -> dict:
    rewards = [s.reward for s in samples]
    gen_tokens = sum(len(s.token_ids) for s in samples)
    m = sum(rewards) / len(rewards)
    phases_now = run.timer.stats
    gen_s = phases_now.get("generation").seconds if "generation" in phases_now else stats.generation_s
    train_s = sum(phases_now[p].seconds for p in ("train_fwd_bwd", "optimizer") if p in phases_now)
    versions = sorted({s.version for s in samples})
    return {
        "version": versions[0] if len(versions) == 1 else versions,
        "published_version": publication.version,
        "reward": {
            "mean": m,
            "std": (sum((r - m) ** 2 for r in rewards) / len(rewards)) ** 0.5,
            "min": min(rewards),
            "max": max(rewards),
            "statuses": dict(Counter(s.status for s in samples)),
        },
        "tokens": {
            "generated": gen_tokens,
            "trained": gen_tokens,
            "mean_completion": gen_tokens / len(samples),
            "truncated_fraction": _mean([float(s.truncated) for s in samples]),
        },
        "throughput": {
            "generated_tokens_per_s": gen_tokens / gen_s if gen_s > 0 else 0.0,
            "trained_tokens_per_s": gen_tokens / train_s if train_s > 0 else 0.0,
            "samples_scored_per_s": stats.samples / max(stats.generation_s + stats.scoring_tail_s, 1e-9),
            "scoring_hidden_fraction": 1.0 - stats.scoring_tail_s / max(stats.scoring_busy_s, 1e-9)
            if stats.scoring_busy_s > 0
            else 0.0,
        },
        "logprob_agreement": agreement,
        "train": {
            k: _mean([t[k] for t in train if k in t])
            for k in ("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean", "grad_norm")
            if any(k in t for t in train)
        },
        "publication": {
            "activated": bool(publication.activated),
            "bytes_received": int(sum(publication.stats.recv.values())),
            "bytes_local": int(publication.stats.local),
            "bytes_staged": int(publication.bytes_staged),
            "seconds": float(publication.seconds.get("total", 0.0)),
        },
    }


def reward_stats(records: list[dict], window: int = 10) -> str:
    """The closing lines of a run: mean reward of the first and last `window` steps, and the ratio."""
    rewards = [r["reward"]["mean"] for r in records]
    if not rewards:
        return "no steps were run"
    w = min(window, max(len(rewards) // 2, 1))
    first, last = _mean(rewards[:w]), _mean(rewards[-w:])
    ratio = last / first if first > 0 else float("inf")
    return (
        f"reward: first-{w} mean {first:.4f}, last-{w} mean {last:.4f} "
        f"(x{ratio:.2f}) over {len(rewards)} steps"
    )
