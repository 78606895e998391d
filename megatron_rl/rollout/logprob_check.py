"""Does the trainer score the engine's tokens the way the engine sampled them?

Run every step on one published version: the engine's exact token ids go back through the trainer
teacher-forced (in a batch that mixes versions -- partial rollouts continue samples drawn by an
older one -- only the tokens of its newest version are compared, and the others are counted) (position t of the completion is predicted from prompt + completion[:t], the same
alignment as the engine's per-token log-probs), and the two log-probs are compared token by token.
In a multi-turn trajectory the generated tokens of every turn are compared, the
observations' (the environment's, never sampled) are not. A drift here is an engine/trainer mismatch (a wrong weight mapping, a stale prefix cache, a different
sampling convention, precision); it silently biases every importance ratio built on the saved values.

Reported (diff = trainer - engine, in nats; ratio = exp(diff) = p_trainer / p_engine per token):
    mean_abs_diff, max_abs_diff, ratio_mean, ratio_p99, ratio_max, ratio_min,
    beyond_threshold (indices of sequences whose max |diff| exceeds the threshold),
    nonfinite_tokens (a token the trainer gives probability 0, e.g. outside its own top-p nucleus).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from megatron_rl.rollout.convention import needs_full_vocab, trainer_temperature
from megatron_rl.rollout.types import Sample, SamplingSettings

# (sequences, prompt_lens) -> one 1-D tensor of completion log-probs per sequence (Policy.logprobs, bound).
LogprobsFn = Callable[[list[list[int]], list[int]], list[torch.Tensor]]


def compare(
    engine_samples: Sequence[Sample],
    trainer_logprobs: Sequence[torch.Tensor],
    threshold: float,
    version: int | None = None,
) -> dict:
    """Token-level agreement of the engine's saved log-probs and the trainer's, as a flat dict.

    Only the tokens of `version` are compared (None: the newest among these samples). Pass the whole
    batch's newest version when comparing a share of it (a DP rank's, a minibatch's): a share made of
    carried samples alone then compares nothing, instead of an older version against the trainer."""
    if len(engine_samples) != len(trainer_logprobs):
        raise ValueError(
            f"{len(engine_samples)} samples but {len(trainer_logprobs)} trainer log-prob sequences"
        )
    if not engine_samples:
        raise ValueError("no samples to compare")
    newest = (
        version if version is not None else max(v for s in engine_samples for v in [s.version, *s.versions])
    )
    diffs, per_seq_max, older = [], [], 0
    for i, (s, lp) in enumerate(zip(engine_samples, trainer_logprobs)):
        t = torch.as_tensor(lp, dtype=torch.float64).reshape(-1)
        if t.numel() != len(s.logprobs):
            raise ValueError(
                f"sequence {i}: trainer gave {t.numel()} log-probs for {len(s.logprobs)} engine tokens; "
                "score prompt + completion with prompt_len = len(prompt) so positions align"
            )
        d = t - torch.tensor(s.logprobs, dtype=torch.float64)
        same = torch.tensor([v == newest for v in s.versions], dtype=torch.bool)
        generated = torch.tensor(s.generated_mask, dtype=torch.bool)
        older += int((~same & generated).sum())
        # another version's tokens measure drift between versions, not the engine/trainer match; a multi-turn
        # observation's tokens (mask 0) were never sampled, so the engine holds no log-prob of them
        d = d[same & generated]
        diffs.append(d)
        per_seq_max.append(d.abs().max().item() if d.numel() else 0.0)
    d_all = torch.cat(diffs)
    finite = torch.isfinite(d_all)
    d = d_all[finite]
    ratio = d.exp()
    have = d.numel() > 0

    def stat(x: torch.Tensor | None) -> float:
        return float(x) if have and x is not None else float("nan")

    return dict(
        version=newest,
        sequences=len(engine_samples),
        tokens=int(d_all.numel()),  # compared: the newest version's generated tokens
        older_version_tokens=older,
        threshold=threshold,
        mean_abs_diff=stat(d.abs().mean() if have else None),
        max_abs_diff=stat(d.abs().max() if have else None),
        mean_diff=stat(d.mean() if have else None),
        ratio_mean=stat(ratio.mean() if have else None),
        ratio_p99=stat(torch.quantile(ratio, 0.99) if have else None),
        ratio_max=stat(ratio.max() if have else None),
        ratio_min=stat(ratio.min() if have else None),
        nonfinite_tokens=int((~finite).sum()),
        beyond_threshold=[i for i, m in enumerate(per_seq_max) if not m <= threshold],  # NaN/inf count
    )


def bind_trainer_logprobs(policy_logprobs: Callable, mode: str, sampling: SamplingSettings) -> LogprobsFn:
    """Policy.logprobs with the temperature that makes its values follow the engine's convention.

    Refuses top-p/top-k in processed mode: the trainer's vocab-parallel path cannot rebuild the
    nucleus (rollout/sampling.py); gather full-vocabulary logits and use token_logprobs_full_vocab.
    """
    if needs_full_vocab(mode, sampling.top_p, sampling.top_k):
        raise ValueError(
            f"top_p={sampling.top_p}, top_k={sampling.top_k} in {mode}: the behaviour distribution is "
            "truncated and the trainer's vocab-parallel log-probs cannot follow it. Use top_p=1 and "
            "top_k=-1, or score with rollout.sampling.token_logprobs_full_vocab on gathered logits"
        )
    temperature = trainer_temperature(mode, sampling.temperature)

    def fn(sequences: list[list[int]], prompt_lens: list[int]) -> list[torch.Tensor]:
        return policy_logprobs(sequences, prompt_lens, temperature=temperature)

    return fn


def check_samples(samples: Sequence[Sample], logprobs_fn: LogprobsFn, threshold: float) -> dict:
    """The per-step check: trainer log-probs on the engine's exact tokens, compared (see `compare`).

    Collective when `logprobs_fn` is (Policy.logprobs): every rank of the model group calls it.
    """
    sequences = [s.sequence for s in samples]
    prompt_lens = [s.prompt_len for s in samples]
    return compare(samples, logprobs_fn(sequences, prompt_lens), threshold)
