"""Runs of the tiny recipe launched once per session and read by every test here that only reads a run's
outputs (each launch costs ~20 s of start-up on 2 cores before its first step). Their settings:
tests/helpers/tiny_run.py (TINY, ENGINE, VERBOSE).

- `tiny_run`: 3 steps, KL on (a reference model), one minibatch with the old log-probs recomputed,
  the progress bar and W&B (offline) on. Read by test_tiny_loop (records, phases, memory, versions,
  agreement, W&B, timeline), test_console_and_report (the quiet terminal, log.txt, `megatron-rl
  report`, `plan --from-steps`) and test_old_logprobs (the `recompute` side of auto against recompute).
- `engine_run`: 3 steps under the device guard, the engines' log-probs as the old ones (two
  minibatches), dynamic sampling. Read by test_old_logprobs and test_guarded_loop (the loop under the
  device guard; dynamic sampling keeps the batch full).
- `verbose_oversampled_run`: 2 steps with rollout.oversample=1.5, no KL (no reference phase), with
  MEGATRON_RL_VERBOSE=1, scored by a reward fleet of one sandbox server (reward.endpoints). Read by test_oversample (the groups kept and dropped) and
  test_console_and_report (what the quiet terminal keeps out; a run without a reference to compare).
"""

from __future__ import annotations

import pytest
import requests

from megatron_rl.reward.server import TOKEN_ENV
from tests.helpers.fleet import TINY_REWARD, TOKEN, start_server, stop
from tests.helpers.tiny_run import (
    ENGINE,
    ENGINE_ENV,
    ENGINE_STEPS,
    TINY,
    TINY_STEPS,
    VERBOSE,
    VERBOSE_ENV,
    VERBOSE_STEPS,
    launch,
    records,
)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(folder, step records) of the `tiny` run: its terminal output is <folder>/tiny.log, its outputs
    <folder>/outputs/tiny."""
    tmp = tmp_path_factory.mktemp("tiny_run")
    launch(tmp, TINY_STEPS, [*TINY, "algorithm.old_logprobs=recompute"], name="tiny")
    return tmp, records(tmp, "tiny")


@pytest.fixture(scope="session")
def engine_run(tmp_path_factory):
    """(folder, step records) of the `engine` run (its terminal output: <folder>/engine.log)."""
    tmp = tmp_path_factory.mktemp("engine_run")
    # Under the device guard (trainer/device_guard.py): the whole loop fails here where it would on a GPU.
    launch(tmp, ENGINE_STEPS, ENGINE, name="engine", env=ENGINE_ENV)
    return tmp, records(tmp, "engine")


@pytest.fixture(scope="session")
def verbose_oversampled_run(tmp_path_factory):
    """(folder, step records) of the `verbose` run (<folder>/verbose.log, <folder>/outputs/verbose). It
    scores through a reward fleet of one real sandbox server (reward.endpoints), whose /health after the
    run is <folder>/fleet_health.json."""
    tmp = tmp_path_factory.mktemp("verbose_oversampled")
    server, address = start_server(tmp, "fleet", "--workers", "2", *TINY_REWARD)
    try:
        fleet = [f"reward.endpoints=[{address}]"]
        launch(tmp, VERBOSE_STEPS, [*VERBOSE, *fleet], name="verbose", env={**VERBOSE_ENV, TOKEN_ENV: TOKEN})
        (tmp / "fleet_health.json").write_text(requests.get(f"http://{address}/health", timeout=10).text)
    finally:
        stop(server)
    return tmp, records(tmp, "verbose")
