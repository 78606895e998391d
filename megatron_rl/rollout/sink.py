"""The reshard publisher's EngineSink (reshard/publish.py) onto a live VLLMEngine.

Staging keeps the received tensors out of the engine, so version N serves untouched until N+1 has
arrived whole on every engine rank and passed validation; only `activate` writes into the engine:
- delivery "loader": whole HF tensors, reloaded in fused groups by `VLLMEngine.update_weights`
  (vLLM slices its own TP part; the only path the CPU build accepts);
- delivery "inplace" (GPU): each rank's tensors already in vLLM's names and TP slices, copied into
  the live parameters by `VLLMEngine.update_weights_inplace`.
Both reset the prefix cache. The staged copy is dropped once activated or discarded.

`keep_previous` (the log-prob probe is on, loop/placement/probe.py): activation keeps what the engine served
before until the probe's verdict, so a refused probe can put it back (`roll_back`):
- loader: the sink keeps the tensors of the version it activated last (whole HF tensors, one copy of the
  model where the staged copy lived), and a roll-back reloads them;
- in place: activation swaps, so the staging buffers hold the previous version's slices, and a roll-back
  copies them back. Nothing is kept when the engine held no policy before (its first publication, or
  after a level-2 sleep discarded the weights): a roll-back then leaves nothing to serve.
`settle()` (the probe passed) drops what was kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from megatron_rl.rollout.vllm_engine import VLLMEngine

DELIVERIES = ("loader", "inplace")


class VLLMEngineSink:
    def __init__(self, engine: VLLMEngine, delivery: str = "loader", keep_previous: bool = False):
        if delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}; got {delivery!r}")
        self.engine, self.delivery, self.keep_previous = engine, delivery, keep_previous
        self._staged: dict[int, dict[str, torch.Tensor]] = {}
        self._active: dict[str, torch.Tensor] | None = None  # loader, keep_previous: the active version's
        self._previous: tuple[int, dict[str, torch.Tensor]] | None = None  # until the probe's verdict

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
        before = self.active_version if self.engine.holds_weights else None
        if self.delivery == "loader":
            self.engine.update_weights(tensors.items(), version)
            if self.keep_previous:
                previous, self._active = self._active, tensors
                self._previous = (before, previous) if before is not None and previous is not None else None
        else:
            swap = self.keep_previous and before is not None  # nothing worth keeping after a level-2 sleep
            self.engine.update_weights_inplace(tensors.items(), version, keep_previous=swap)
            if self.keep_previous:  # the staging buffers now hold what served before
                self._previous = (before, tensors) if swap else None

    def discard(self, version: int) -> None:
        self._staged.pop(version, None)

    def roll_back(self) -> int | None:
        """Serve again the version active before the last activation; returns it, or None when there was
        none (the engine then serves nothing until a publication activates)."""
        kept, self._previous = self._previous, None
        if kept is None:
            self._active = None
            self.engine.discard_weights()
            return None
        version, tensors = kept
        self.engine.restore_weights(tensors.items(), version, inplace=self.delivery == "inplace")
        if self.delivery == "loader":
            self._active = tensors
        return version

    def settle(self) -> None:
        """The active version passed its probe: what was kept to roll back is dropped."""
        self._previous = None
