"""Session set-up shared by every tier.

The `grpo_tiny_hf_cpu` recipe names a checkpoint built on first use (`launch_local` builds it;
models/fixture.py). Tests that plan, validate or submit every shipped recipe need it readable, so it
is built once per session into a temporary folder that the recipe's `${oc.env:MEGATRON_RL_FIXTURES}`
points at (processes the tests start inherit it).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def hf_fixtures(tmp_path_factory):
    from megatron_rl.models.fixture import build_fixture

    root = tmp_path_factory.mktemp("fixtures")
    previous = os.environ.get("MEGATRON_RL_FIXTURES")
    os.environ["MEGATRON_RL_FIXTURES"] = str(root)
    build_fixture("qwen2", root / "qwen2")
    yield root
    if previous is None:
        os.environ.pop("MEGATRON_RL_FIXTURES", None)
    else:
        os.environ["MEGATRON_RL_FIXTURES"] = previous
