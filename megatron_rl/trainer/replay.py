"""Routing replay: the trainer's MoE layers use the experts the engine routed each token to.

An MoE engine and trainer compute the router's logits with different kernels; a token near a tie then
goes to other experts in the trainer than it did in the engine, and its log-prob moves by far more than
the numerics of one expert would. With `algorithm.routing_replay`, every sample carries the engine's
top-k experts per position and layer (rollout/routes.py), and each of the trainer's forwards (old-policy
and reference log-probs, every update) selects exactly those, through megatron-core's `RouterReplay`
(`moe_enable_routing_replay`); the gate's probabilities are still computed by the trainer, over those
experts, so gradients reach the router as before.

Each layer's own `router.router_replay` is set, not megatron-core's process-global list of them: the
policy and the reference are two models with a list entry per layer each.

The routes stay in host memory, as bytes; each layer's slice moves to the device just before its
forward. Positions the engine never ran (the last completion token, right padding) take experts 0..k-1: their
outputs predict nothing that is scored. Token order is megatron's: s-major over the [S, B] microbatch,
and with sequence parallelism each TP rank routes its own contiguous S/TP positions.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def routes_grid(
    routes: list[torch.Tensor], lengths: list[int], seq_len: int, topk: int, layers: int
) -> torch.Tensor:
    """Per-sequence routes ([fed positions, layers, k]) laid out on a microbatch's [B, S, layers, k] grid."""
    grid = (
        torch.arange(topk, dtype=torch.uint8, device="cpu").expand(len(routes), seq_len, layers, topk).clone()
    )
    for b, (r, n) in enumerate(zip(routes, lengths)):
        if r.shape[0] != n - 1 or r.shape[1:] != (layers, topk):
            raise ValueError(
                f"sequence {b}: routes of shape {list(r.shape)}, expected [{n - 1}, {layers}, {topk}]"
            )
        grid[b, : n - 1] = r
    return grid


def set_replay(
    model, routes_BSLK: torch.Tensor, tp_rank: int = 0, tp: int = 1, sequence_parallel: bool = False
) -> None:
    """Before a forward: every MoE layer of this stage replays its slice of the microbatch's routes."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    B, S, _, k = routes_BSLK.shape
    for layer in model.decoder.layers:
        replay = layer.mlp.router.router_replay
        if replay is None:
            raise RuntimeError("routing replay: the model was built without moe_enable_routing_replay")
        idx = routes_BSLK[:, :, layer.layer_number - 1, :].transpose(0, 1)  # [S, B, k]
        if sequence_parallel and tp > 1:
            idx = idx.chunk(tp, 0)[tp_rank]
        # The grid stays on the host as bytes (3 KB a token at 48 layers x top-8 as int64); one layer's
        # slice goes to the router's device as the index type gather() takes.
        device = layer.mlp.router.weight.device
        replay.clear_indices()
        replay.set_target_indices(idx.reshape(-1, k).to(device=device, dtype=torch.long))
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)


def clear_replay(model) -> None:
    """After a step: the layers choose their own experts again, and hold no indices."""
    for layer in model.decoder.layers:
        replay = getattr(layer.mlp.router, "router_replay", None)
        if replay is not None:
            replay.clear_indices()
            replay.clear_router_replay_action()


@contextmanager
def replaying(model, on: bool):
    """Around a forward/backward pass: afterwards every layer chooses its own experts again."""
    try:
        yield
    finally:
        if on:
            clear_replay(model)


def routes_of(samples, idx: list[int], on: bool) -> list[torch.Tensor] | None:
    """The engine's routes of samples[i] for i in idx when replaying (None otherwise)."""
    if not on:
        return None
    missing = [i for i in idx if samples[i].routes is None]
    if missing:
        raise RuntimeError(f"routing replay: {len(missing)} samples came without the engine's routes")
    return [samples[i].routes for i in idx]
