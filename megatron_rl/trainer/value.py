"""A value model: megatron-core's GPTModel with one scalar per token instead of the vocabulary's logits.

PPO's critic and a learned reward model are the same network: the policy's transformer body, then a
linear map from the final norm's output to one number. The critic reads that number at every position
(the value of the state before each token); a reward model reads it after the last token, as
transformers' `*ForSequenceClassification` does for a sequence without padding.

The head replaces the last stage's `output_layer` (GPTModel calls `output_layer(hidden, weight=...,
runtime_gather_output=...)` and transposes the result to [B, S, .]), so megatron-core's pipeline
schedules, DDP, distributed optimizer and checkpointing treat it as any other parameter. Its weight
[1, h] is replicated over tensor-parallel ranks: each rank computes the same values from the same hidden
states. With sequence parallelism the hidden states arrive split along the sequence, so the head first
gathers them; the backward then keeps each rank's own slice of the gradient (`tensor_parallel_output_grad
=False`) instead of summing identical copies, and the head's gradient is the same on every TP rank, so it
needs no reduction (megatron reduces the norms' over TP because each rank saw only its slice; this one saw
all of them).

Legend: S sequence, B batch, h hidden size.
"""

from __future__ import annotations

import torch

HEAD_PARAM = "output_layer.weight"  # the head's parameter in a value model (models/hf.py VALUE_HEAD maps it)


class ValueHead(torch.nn.Module):
    """hidden [S, B, h] (a slice of S with sequence parallelism) -> values [S, B, 1] in fp32, and no bias."""

    def __init__(
        self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool, tp_group=None, device=None
    ):
        super().__init__()
        # Named as the output layer's weight (`output_layer.weight`, [1, h]), so megatron-core's checkpointing
        # of a language model finds the key it expects; the HF mapping calls it VALUE_HEAD (models/hf.py).
        # A fresh critic predicts 0 everywhere.
        # On the model's device: a factory without one puts the tensor on the host (a bug on GPU).
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype, device=device))
        self.sequence_parallel = sequence_parallel  # GPTModel reads this attribute in inference mode only
        self.tp_group = tp_group

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False, group=self.tp_group
            )
        values = torch.nn.functional.linear(hidden_states.float(), self.weight.float())
        return values, None


def attach_value_head(model, config, groups=None) -> None:
    """Replace a last-stage GPTModel's output layer with a zero value head (in place, before any wrapper:
    DDP and the optimizer must see the head's parameter, not the vocabulary's). `groups`: the model's own
    process groups (trainer/model_groups.py), else megatron-core's global ones."""
    from megatron.core import parallel_state as ps

    if not getattr(model, "post_process", False):
        return
    device = next(model.parameters()).device
    if groups is not None:
        tp_group = groups.tp
    else:
        tp_group = ps.get_tensor_model_parallel_group() if ps.model_parallel_is_initialized() else None
    head = ValueHead(
        config.hidden_size, config.params_dtype, bool(config.sequence_parallel), tp_group, device=device
    )
    model.output_layer = head


def per_token_values(out_BS1: torch.Tensor) -> torch.Tensor:
    """The model's output [B, S, 1] -> [B, S - 1]: position t's value is that of the state before token
    t + 1, on the grid of teacher-forced log-probs (trainer/logprobs.py), so completions line up."""
    return out_BS1[:, :-1, 0].float().contiguous()


def last_token_values(out_BS1: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The value after each sequence's last real token, [B, 1]: a reward model's score (right padding: the
    padded positions come after it and do not change it)."""
    idx = torch.as_tensor([n - 1 for n in lengths], device=out_BS1.device)
    rows = torch.arange(out_BS1.shape[0], device=out_BS1.device)
    return out_BS1[rows, idx, 0].float().unsqueeze(-1).contiguous()
