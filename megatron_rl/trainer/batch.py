"""Variable-length sequences -> fixed-shape microbatches for megatron-core's pipeline schedules.

Pipeline p2p buffers have one shape for the whole schedule, so under pipeline parallelism every
microbatch is right-padded to one length. Without it (`by_length=True`), sequences are grouped into
microbatches by length and each microbatch is padded to its own longest: prompts of a real problem set
differ by 2x in length, and one length for all spent 18-33% of the trainer's tokens on padding.
Right padding needs no attention mask: with causal attention a real token never
attends to a later (padding) position, so padded and unpadded sequences give the same logits for
their real tokens; padding only has to be masked out of the loss.

One device rule: a microbatch lives where the policy computes. `make_microbatches(..., device=)`
assembles on the host (many small row writes, cheap there) and moves every tensor -- tokens,
positions, mask and every per-token extra -- to the policy's device in one step, so a loss never
meets a host tensor next to device log-probs.

Legend: B = sequences in a microbatch, S = padded length, T = S - 1 predicted positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from megatron_rl.trainer.replay import routes_grid


@dataclass
class Microbatch:
    tokens_BS: torch.Tensor  # int64 token ids, right-padded with 0
    position_ids_BS: torch.Tensor
    lengths: list[int]  # real length of each sequence
    # Position t predicts token t+1; mask is 1 where that target is a completion token.
    loss_mask_BT: torch.Tensor
    index: list[int]  # position of each sequence in the caller's list
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per-token tensors [B, T]
    routes: torch.Tensor | None = (
        None  # routing replay: experts per position and layer [B, S, L, k] uint8, host
    )

    def to(self, device: torch.device | str) -> Microbatch:
        """The same microbatch with every tensor (extras included) on `device`."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return Microbatch(
            move(self.tokens_BS),
            move(self.position_ids_BS),
            list(self.lengths),
            move(self.loss_mask_BT),
            list(self.index),
            {k: move(v) for k, v in self.extras.items()},
            self.routes,  # host bytes: each layer's slice moves to the device at its forward (trainer/replay.py)
        )


def padded_length(lengths: list[int], multiple: int = 8) -> int:
    longest = max(lengths)
    return ((longest + multiple - 1) // multiple) * multiple


def make_microbatches(
    sequences: list[list[int]],
    prompt_lens: list[int],
    micro_batch_size: int,
    seq_len: int | None = None,
    extras: dict[str, list[torch.Tensor]] | None = None,
    multiple: int = 8,
    device: torch.device | str = "cpu",
    by_length: bool = False,
    routes: list[torch.Tensor] | None = None,
) -> list[Microbatch]:
    """Split sequences (prompt + completion token ids) into right-padded microbatches on `device`.

    `extras` holds per-completion-token values (e.g. advantages, old log-probs), one 1-D tensor per
    sequence of length len(seq) - prompt_len; they are laid out on the same [B, T] grid as the mask.
    `by_length`: microbatches of similar lengths, each padded to its own longest (not with `seq_len`);
    each microbatch's `index` still names the caller's positions, so results map back unchanged.
    """
    if len(sequences) != len(prompt_lens):
        raise ValueError(f"{len(sequences)} sequences but {len(prompt_lens)} prompt lengths")
    if len(sequences) % micro_batch_size:
        raise ValueError(f"{len(sequences)} sequences do not split into microbatches of {micro_batch_size}")
    lengths = [len(s) for s in sequences]
    if by_length and seq_len is not None:
        raise ValueError("by_length pads each microbatch to its own length; it takes no seq_len")
    S = seq_len or padded_length(lengths, multiple)
    if max(lengths) > S:
        raise ValueError(f"a sequence of {max(lengths)} tokens exceeds the padded length {S}")
    order = list(range(len(sequences)))
    if by_length:  # longest first, ties in the caller's order: the same grouping on every rank and run
        order.sort(key=lambda i: -lengths[i])
    host = "cpu"  # assembled on the host, then moved to `device` in one step
    out = []
    for start in range(0, len(sequences), micro_batch_size):
        # Inside a microbatch, the caller's order: a step whose grouping is trivial (one microbatch)
        # computes bit for bit what it did before.
        idx = sorted(order[start : start + micro_batch_size])
        if by_length:
            S = padded_length([lengths[i] for i in idx], multiple)
        tokens = torch.zeros(len(idx), S, dtype=torch.long, device=host)
        mask = torch.zeros(len(idx), S - 1, dtype=torch.float32, device=host)
        ex = {k: torch.zeros(len(idx), S - 1, dtype=torch.float32, device=host) for k in (extras or {})}
        for b, i in enumerate(idx):
            seq, p = sequences[i], prompt_lens[i]
            if not 0 < p <= len(seq):
                raise ValueError(f"sequence {i}: prompt length {p} outside 1..{len(seq)}")
            tokens[b, : len(seq)] = torch.as_tensor(seq, dtype=torch.long, device=host)
            mask[b, p - 1 : len(seq) - 1] = 1.0
            for k, values in (extras or {}).items():
                v = values[i]
                if v.numel() != len(seq) - p:
                    raise ValueError(
                        f"extras[{k!r}][{i}] has {v.numel()} values for {len(seq) - p} completion tokens"
                    )
                ex[k][b, p - 1 : len(seq) - 1] = v.float()
        pos = torch.arange(S, device=host).unsqueeze(0).expand(len(idx), S).contiguous()
        grid = None
        if routes is not None:  # routing replay (trainer/replay.py)
            _, layers, k = routes[idx[0]].shape
            grid = routes_grid([routes[i] for i in idx], [lengths[i] for i in idx], S, k, layers)
        out.append(Microbatch(tokens, pos, [lengths[i] for i in idx], mask, idx, ex, grid).to(device))
    return out


def completion_values(
    mb_values_BT: list[torch.Tensor], microbatches: list[Microbatch], prompt_lens: list[int]
):
    """Per-sequence 1-D tensors of the completion positions, back in the caller's order."""
    n = sum(len(mb.index) for mb in microbatches)
    out: list[torch.Tensor | None] = [None] * n
    for values, mb in zip(mb_values_BT, microbatches):
        for b, i in enumerate(mb.index):
            p, L = prompt_lens[i], mb.lengths[b]
            out[i] = values[b, p - 1 : L - 1].clone()
    return out
