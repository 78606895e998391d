"""The sampling convention: which distribution the saved log-probs describe, and the trainer's match.

vLLM samples a token from logits z in this order (v1 sampler, checked against HF logits on the CPU
build, DESIGN.md section 4):

    1. raw_logprobs       = log_softmax(z)                            <- taken here in "raw" mode
    2. z <- z / T                                                     (skipped when T < 1e-5: greedy)
    3. top-k: keep z_i >= the k-th largest z (ties are kept)
    4. top-p: sort ascending, p = softmax; drop the tokens whose cumulative mass (counting
       themselves) is <= 1 - top_p; the largest token is always kept
    5. processed_logprobs = log_softmax(filtered z)                   <- taken here in "processed" mode
       (renormalised over the kept set; dropped tokens are -inf)
    6. sample from softmax(filtered z)

**The convention of this project is `processed_logprobs`** (the default of `rollout.logprobs_mode`):
the saved log-prob is the log-probability under the distribution the token was actually drawn from,
so it is the behaviour policy of the importance ratio. The trainer must compute its log-probs with
the same transform, `apply_sampling_convention`, on the same settings. Two consequences:

- With top_p = 1 and top_k off (the shipped recipes), steps 3-4 do nothing and the convention is
  log_softmax(z / T): exactly what trainer/logprobs.py computes from vocab-parallel logits without
  gathering the vocabulary. `needs_full_vocab` says when that shortcut is not enough.
- With top-p or top-k on, the behaviour distribution has a truncated support. The trainer then needs
  the full-vocabulary logits (gather over TP) to rebuild the nucleus, and a sampled token can fall
  outside the *trainer's* nucleus (the policy moved, or a boundary token flips under rounding): its
  log-prob is -inf and the ratio degenerates. RL runs should keep top_p = 1 and top_k off.

In "raw_logprobs" mode the saved value ignores temperature and filters, so the trainer must use
T = 1 (`trainer_temperature`); the sampled distribution then differs from the saved one whenever
T != 1, which biases any ratio built on it. That mode exists for diagnosis, not for training.

Legend: N rows (token positions, any leading dims), V vocabulary, B sequences, T positions.
"""

from __future__ import annotations

import torch

# The rules (allowed values, when the full vocabulary is needed, the trainer's temperature) live in
# rollout/convention.py, torch-free, so `validate` applies the same ones.
from megatron_rl.rollout.convention import (  # noqa: F401  (re-exported for the trainer side)
    GREEDY_EPS,
    convention_problems,
    needs_full_vocab,
    trainer_temperature,
)


def _check(mode: str, temperature: float, top_p: float, top_k: int = -1) -> None:
    problems = convention_problems(mode, temperature, top_p, top_k, training=False)
    if problems:
        raise ValueError(str(problems[0]))


def filter_logits(scaled_NV: torch.Tensor, top_p: float = 1.0, top_k: int = -1) -> torch.Tensor:
    """Temperature-scaled logits with the tokens outside top-k, then top-p, set to -inf (steps 3-4)."""
    z = scaled_NV.float()
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth_N1 = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth_N1, float("-inf"))
    if top_p < 1.0:
        sorted_NV, order_NV = z.sort(dim=-1, descending=False)
        cum_NV = sorted_NV.softmax(dim=-1).cumsum(dim=-1)
        # float32 arithmetic as in the engine, so a boundary token is decided the same way.
        drop_NV = cum_NV <= 1 - torch.tensor(top_p, dtype=torch.float32)
        drop_NV[..., -1] = False
        sorted_NV = sorted_NV.masked_fill(drop_NV, float("-inf"))
        z = torch.empty_like(z).scatter_(-1, order_NV, sorted_NV)
    return z


def apply_sampling_convention(
    logits_NV: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    mode: str = "processed_logprobs",
) -> torch.Tensor:
    """Full-vocabulary log-probs [..., V] (float32) under the engine's convention (module docstring).

    `logits_NV` must be the model's logits over the real vocabulary (padding columns removed).
    """
    _check(mode, temperature, top_p, top_k)
    z = logits_NV.float()
    if mode == "raw_logprobs" or temperature < GREEDY_EPS:
        return torch.log_softmax(z, dim=-1)
    return torch.log_softmax(filter_logits(z / temperature, top_p, top_k), dim=-1)


def token_logprobs_full_vocab(
    logits_BTV: torch.Tensor,
    targets_BT: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    mode: str = "processed_logprobs",
) -> torch.Tensor:
    """log p(target) [B, T] under the convention, from full-vocabulary logits (gathered over TP)."""
    lp_BTV = apply_sampling_convention(logits_BTV, temperature, top_p, top_k, mode)
    return lp_BTV.gather(-1, targets_BT.long().unsqueeze(-1)).squeeze(-1)
