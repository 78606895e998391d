"""Containment of the engine's process side effects that can be checked without an engine."""

import random

import numpy as np
import torch

from megatron_rl.rollout.process import count_at_least, preserved_rng
from megatron_rl.rollout.vllm_engine import request_seed


def test_preserved_rng_restores_every_generator():
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    with preserved_rng():
        torch.manual_seed(0)  # what vLLM's set_random_seed does, then draws
        random.seed(0)
        np.random.seed(0)
        torch.rand(100), random.random(), np.random.rand()
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_request_seeds_are_stable_and_distinct():
    # Fixed values: a change here changes every sampled rollout of an existing run on resume.
    assert request_seed(0, 0, 0, 0, 0) == 3919907391999606062
    assert request_seed(1234, 1, 7, 3, 2) == 380364008517091167
    seeds = {
        request_seed(s, e, c, p, i)
        for s in range(2)
        for e in range(2)
        for c in range(2)
        for p in range(3)
        for i in range(4)
    }
    assert len(seeds) == 2 * 2 * 2 * 3 * 4
    assert all(0 <= x < 2**63 for x in seeds)


def test_count_at_least_is_the_tokens_rank_ties_included():
    x = torch.tensor([[0.1, 0.5, 0.5, 0.2], [-1.0, -2.0, -3.0, -0.5]])
    values = torch.tensor([[0.5], [-3.0]])
    assert count_at_least(x, values).tolist() == [2, 4]  # what vLLM's compiled count returns (x >= v)
