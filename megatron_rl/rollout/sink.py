"""The reshard publisher's EngineSink (reshard/publish.py) onto a live VLLMEngine.

Staging keeps the received tensors out of the engine, so version N serves untouched until N+1 has
arrived whole on every engine rank and passed validation; only `activate` writes into the engine:
- delivery "loader": whole HF tensors, reloaded in fused groups by `VLLMEngine.update_weights`
  (vLLM slices its own TP part; the only path the CPU build accepts);
- delivery "inplace" (GPU): each rank's tensors already in vLLM's names and TP slices, copied into
  the live parameters by `VLLMEngine.update_weights_inplace`.
Both reset the prefix cache. The staged copy is dropped once activated or discarded.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from megatron_rl.rollout.vllm_engine import VLLMEngine

DELIVERIES = ("loader", "inplace")


class VLLMEngineSink:
    def __init__(self, engine: VLLMEngine, delivery: str = "loader"):
        if delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}; got {delivery!r}")
        self.engine, self.delivery = engine, delivery
        self._staged: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def active_version(self) -> int | None:
        return None if self.engine.version < 0 else self.engine.version

    @property
    def holds_weights(self) -> bool:
        """Whether the active version could serve again now (False after a level-2 sleep discarded it)."""
        return self.active_version is not None and self.engine.holds_weights

    def stage(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        if version in self._staged:
            raise RuntimeError(f"version {version} is already staged")
        active = self.active_version
        if active is not None and version <= active:
            raise ValueError(f"version {version} is not newer than the active version {active}")
        self._staged[version] = tensors

    def staged(self, version: int) -> Mapping[str, torch.Tensor]:
        return self._staged[version]

    def activate(self, version: int) -> None:
        tensors = self._staged.pop(version)
        if self.delivery == "loader":
            self.engine.update_weights(tensors.items(), version)
        else:
            self.engine.update_weights_inplace(tensors.items(), version)

    def discard(self, version: int) -> None:
        self._staged.pop(version, None)
