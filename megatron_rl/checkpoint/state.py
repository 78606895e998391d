"""What besides weights and optimizer a run needs to continue exactly: RNG states and run state."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:  # megatron-core's model-parallel RNG tracker (dropout streams)
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        state["megatron_tracker"] = get_cuda_rng_tracker().get_states()
    except Exception:  # noqa: BLE001 - tracker absent before model-parallel init
        pass
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "megatron_tracker" in state:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["megatron_tracker"])
