"""The sampling convention's rules, in one place and without torch.

Which values of `rollout.logprobs_mode`, temperature, top-p and top-k are allowed, which need the
trainer's full-vocabulary path, and which temperature the trainer divides by follow from the
convention described in `rollout/sampling.py`. `validate`, the engine's sampling settings, the
log-prob check and the driver all ask here, so they cannot disagree on a bound.
"""

from __future__ import annotations

import math

from megatron_rl.config.problem import Problem

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
# vLLM treats temperatures below this as greedy (no scaling, no filtering).
GREEDY_EPS = 1e-5


def convention_problems(
    mode: str, temperature: float, top_p: float, top_k: int, training: bool = True
) -> list[Problem]:
    """Every way these settings break the convention (empty: they follow it).

    Training needs temperature > 0: the behaviour policy of the importance ratio is the tempered
    distribution, and greedy decoding has none. Evaluation may decode greedily (temperature 0).
    """
    out = []
    if mode not in LOGPROBS_MODES:
        out.append(Problem("rollout.logprobs_mode", mode, f"must be one of {', '.join(LOGPROBS_MODES)}"))
    low = "> 0 (log-probs are taken at this temperature)" if training else ">= 0 (0 = greedy)"
    if not math.isfinite(temperature) or temperature < 0 or (training and temperature == 0):
        out.append(Problem("rollout.temperature", temperature, f"must be finite and {low}"))
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        out.append(Problem("rollout.top_p", top_p, "must be in (0, 1] (1 = off)"))
    if top_k < -1:
        out.append(Problem("rollout.top_k", top_k, "must be -1 or 0 (off) or >= 1"))
    return out


def needs_full_vocab(mode: str, top_p: float, top_k: int) -> bool:
    """True when the trainer cannot reproduce the convention from vocab-parallel logits alone."""
    return mode == "processed_logprobs" and (top_p < 1.0 or 0 < top_k)


def full_vocab_problem(mode: str, top_p: float, top_k: int) -> Problem | None:
    """The driver's refusal of a truncated behaviour distribution (the planner still models it)."""
    if not needs_full_vocab(mode, top_p, top_k):
        return None
    return Problem(
        "rollout.top_p" if top_p < 1.0 else "rollout.top_k",
        top_p if top_p < 1.0 else top_k,
        f"top_p={top_p} / top_k={top_k} with logprobs_mode={mode} need the trainer's log-probs "
        "renormalised over the sampler's support, which the vocab-parallel trainer does not compute yet; "
        "use top_p=1 and top_k=-1, or logprobs_mode=raw_logprobs",
        kind="driver",
    )


def trainer_temperature(mode: str, temperature: float) -> float:
    """The temperature the trainer divides by so its log-probs follow `mode` (1 in raw mode or greedy)."""
    problems = convention_problems(mode, temperature, 1.0, -1, training=False)
    if problems:
        raise ValueError(str(problems[0]))
    if mode == "raw_logprobs" or temperature < GREEDY_EPS:
        return 1.0
    return temperature
