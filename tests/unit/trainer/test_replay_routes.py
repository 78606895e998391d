"""Routing replay's data path: routes laid out on a microbatch's grid, refused when malformed; samples
carry one row of routes per fed position; the engine recorder files ids under request and position."""

from types import SimpleNamespace as NS

import pytest
import torch

from megatron_rl.rollout.routes import UNSET, RouteRecorder, check_routes
from megatron_rl.rollout.types import Sample
from megatron_rl.trainer.batch import make_microbatches
from megatron_rl.trainer.replay import routes_grid, routes_of


def _routes(n, layers=2, k=2, start=0):
    return (torch.arange(n * layers * k).view(n, layers, k) + start).remainder(4).to(torch.uint8)


def test_routes_land_on_the_grid_and_unfed_positions_take_the_first_experts():
    r = [_routes(4), _routes(2)]
    grid = routes_grid(r, [5, 3], seq_len=8, topk=2, layers=2)
    assert grid.shape == (2, 8, 2, 2)
    assert grid.dtype == torch.uint8 and torch.equal(grid[0, :4], r[0]) and torch.equal(grid[1, :2], r[1])
    assert torch.equal(
        grid[0, 4:], torch.tensor([0, 1], dtype=torch.uint8).expand(4, 2, 2)
    )  # last token and padding


def test_microbatches_carry_each_sequences_routes_in_its_own_row():
    seqs = [[1, 2, 3, 4, 5], [6, 7, 8]]
    r = [_routes(4), _routes(2, start=1)]
    [mb] = make_microbatches(seqs, [2, 1], 2, routes=r)
    assert torch.equal(mb.routes[0, :4], r[0]) and torch.equal(mb.routes[1, :2], r[1])


@pytest.mark.parametrize("bad", [_routes(5), _routes(4, layers=3), _routes(4, k=1)])
def test_routes_of_the_wrong_shape_are_refused(bad):
    with pytest.raises(ValueError, match="expected \\[4, 2, 2\\]"):
        routes_grid([bad], [5], 8, 2, 2)
    if bad.shape[1:] == (2, 2):
        with pytest.raises(ValueError, match="expected \\[4, 2, 2\\]"):
            check_routes(bad, 4, 2, 2, "request x")


def test_a_sample_holds_one_route_row_per_fed_position():
    kw = dict(prompt_index=0, sample_index=0, prompt_ids=[1, 2], token_ids=[3, 4, 5], logprobs=[0.0] * 3,
              finish_reason="stop", truncated=False, version=1)  # fmt: skip
    Sample(**kw, routes=_routes(4))
    with pytest.raises(ValueError, match="routes for 5 positions, expected 4"):
        Sample(**kw, routes=_routes(5))
    with pytest.raises(RuntimeError, match="came without the engine's routes"):
        routes_of([Sample(**kw)], [0], on=True)
    assert routes_of([Sample(**kw)], [0], on=False) is None


def test_the_recorder_files_each_steps_ids_under_request_and_position():
    # One engine step as vLLM's runner lays it out: request b's prefill (positions 0..2) after request a's
    # decode (position 5), and a request of another caller the recorder does not follow.
    runner = NS(
        input_batch=NS(num_reqs=3, req_ids=["c0-p0-s0-1f2e", "c0-p1-s0-9a9a", "other-77"]),
        query_start_loc=NS(cpu=torch.tensor([0, 1, 4, 5])),
        positions=torch.tensor([5, 0, 1, 2, 0]),
    )
    rec = RouteRecorder.__new__(RouteRecorder)
    rec.runner, rec.num_layers, rec.topk, rec.max_len, rec._routes = runner, 2, 2, 8, {}
    rec.begin("c0-p0-s0")
    rec.begin("c0-p1-s0")
    ids = torch.tensor([[1, 2], [3, 0], [2, 1], [0, 3], [1, 1]])
    for layer in (0, 1):
        rec._file(layer, ids)
    b = rec.take("c0-p1-s0", 3)
    assert torch.equal(b[:, 0].long(), ids[1:4]) and torch.equal(b[:, 1].long(), ids[1:4])
    a = rec._routes["c0-p0-s0"]
    assert torch.equal(a[5, 0].long(), ids[0]) and bool((a[:5] == UNSET).all())
    with pytest.raises(RuntimeError, match="no routes at positions \\[0, 1, 2, 3, 4\\]"):
        rec.take("c0-p0-s0", 6)  # positions 0..4 were never routed (served from a prefix cache, say)
