"""Teacher-forced per-token log-probs from vocab-parallel logits.

The last pipeline stage holds logits split over TP ranks by vocabulary rows. Log-softmax over the
whole vocabulary uses megatron-core's `vocab_parallel_cross_entropy` (max and sum-exp all-reduced
over the TP group; its backward is exact), so the full [B, S, V] tensor is never gathered.

Conventions (see rollout/sampling.py for the engine side):
- `temperature` divides the logits first: log p_T(y) = log_softmax(z / T)[y].
- Megatron pads the vocabulary to a multiple of divisible_by x TP; the padded columns are set to
  -inf before the softmax so they carry no probability mass (they would otherwise hold exp(0)).

Legend: B batch, S sequence, T = S - 1 predicted positions, Vl = local vocab slice.
"""

from __future__ import annotations

import torch


def token_logprobs(
    logits_BSVl: torch.Tensor,
    tokens_BS: torch.Tensor,
    vocab_size: int,
    temperature: float = 1.0,
    tp_rank: int = 0,
) -> torch.Tensor:
    """log p(tokens[t+1] | tokens[:t+1]) for t in 0..S-2, shape [B, T], float32.

    Must run on every rank of the TP group (collectives inside).
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    logits = logits_BSVl[:, :-1, :].float() / temperature
    local_v = logits.shape[-1]
    start = tp_rank * local_v
    if start + local_v > vocab_size:  # this slice holds padding rows
        pad_from = max(vocab_size - start, 0)
        col = torch.arange(local_v, device=logits.device)
        logits = logits.masked_fill(col >= pad_from, float("-inf"))
    targets = tokens_BS[:, 1:]
    # megatron's function expects [S, B, V] / [S, B]; it is shape-agnostic in the leading dims.
    nll = vocab_parallel_cross_entropy(
        logits.transpose(0, 1).contiguous(), targets.transpose(0, 1).contiguous()
    )
    return -nll.transpose(0, 1).contiguous()  # contiguous: it may be sent over gloo as raw memory
