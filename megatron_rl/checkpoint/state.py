"""What besides weights and optimizer a run needs to continue exactly: RNG states and run state.

The RNG states are stored as tensors and plain numbers only, so `torch.load(..., weights_only=True)`
reads them: a checkpoint file that unpickles arbitrary objects runs whatever code a planted file
names. numpy's and Python's generator states are converted to and from that form here.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
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
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"].tolist()), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "megatron_tracker" in state:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["megatron_tracker"])


def load_rng_state(path) -> dict:
    """A rank's RNG file, read without unpickling code (weights_only=True)."""
    return torch.load(path, weights_only=True, map_location="cpu")
