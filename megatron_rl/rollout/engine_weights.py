"""How a live vLLM engine takes a publication: reload, in-place write, restore, discard.

`EngineWeights` is the weight side of `VLLMEngine` (rollout/vllm_engine.py), which it is mixed into: it
uses the engine's `llm`, `model`, `on_gpu`, `num_experts`, `version`, `_streaming` and `_weights_valid`.

- `update_weights` (delivery "loader", every build): full HF-named tensors, reloaded by vLLM in one call
  for the whole publication with its fused groups whole (rollout/weights.py). vLLM sets up a layerwise
  reload over the entire model on every call and puts the old kernel tensors back on every layer the call
  did not write, so one call per publication, not per group.
- `update_weights_inplace` (GPU): tensors already in vLLM's layout copied (or swapped) into the live
  parameters, whose storage captured CUDA graphs hold.
- After either, the prefix cache is reset: KV computed with the old weights must not be reused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from megatron_rl.rollout.moe_reload import repack_if_left_raw
from megatron_rl.rollout.weights import covered, fused_group_key, group_fused, target_of


class EngineWeights:
    """The publication methods of `VLLMEngine` (its counters `reload_calls` and `experts_repacked` are set
    where the engine is built)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload full HF-named tensors in place (whole fused groups per call), reset the prefix cache."""
        self._check_newer(version, "update_weights()")
        self._reload(named_tensors, version)

    def update_weights_inplace(
        self, named_params: Iterable[tuple[str, torch.Tensor]], version: int, keep_previous: bool = False
    ) -> None:
        """GPU: copy tensors already in vLLM's layout (vLLM names, this rank's TP slice) into the live
        parameters, keeping their storage (captured CUDA graphs stay valid); then reset the prefix cache.
        `keep_previous`: swap instead of copy, so the tensors passed in hold the version served before
        (a refused probe restores it: `restore_weights(..., inplace=True)`).

        Not on the CPU build: there the linear weights are repacked into oneDNN handles after loading
        (their Parameters have size 0), so only `update_weights` (a reload) reaches them.
        """
        if not self.on_gpu:
            raise RuntimeError(
                "in-place delivery writes vLLM's parameters directly, which the CPU build repacks; publish with "
                "delivery='loader' on CPU"
            )
        self._check_newer(version, "update_weights_inplace()")
        self._write_inplace(list(named_params), version, keep_previous)

    def restore_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, inplace: bool = False
    ) -> None:
        """Serve an earlier version again: its tensors, as `update_weights` (or, `inplace`, as
        `update_weights_inplace`) takes them. The publication after it was refused (loop/placement/probe.py)."""
        if self._streaming:
            raise RuntimeError("restore_weights() while a generation stream is open")
        if inplace:
            self._write_inplace(list(named_tensors), version, False)
        else:
            self._reload(named_tensors, version)

    def discard_weights(self) -> None:
        """The weights served are not a policy (a refused probe with no earlier version to go back to):
        generation refuses to run until a publication activates."""
        self._weights_valid = False

    def _check_newer(self, version: int, what: str) -> None:
        if self._streaming:
            raise RuntimeError(f"{what} while a generation stream is open would change weights mid-sample")
        if version <= self.version:
            raise ValueError(f"version {version} is not newer than the active version {self.version}")

    def _reload(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        groups = group_fused(named_tensors, self.num_experts)
        if not groups:
            raise ValueError(f"publication of version {version} holds no tensors")
        # One reload call for the whole publication, its fused groups whole and one after another: vLLM sets
        # up a layerwise reload over the entire model on every call and, finishing it, puts the old kernel
        # tensors back on every layer the call did not write ("Failed to load weights", once per layer), so
        # a call per group repeated that set-up and that warning for every layer, group after group.
        self.llm.collective_rpc(
            "reload_weights",
            kwargs=dict(weights_iterator=(t for group in groups for t in group), is_checkpoint_format=True),
        )
        self.reload_calls += 1
        if self.num_experts and not self.on_gpu:
            for group in groups:
                if fused_group_key(group[0][0]).endswith(".mlp.experts"):
                    # rollout/moe_reload.py: vLLM's CPU reload leaves the experts unpacked
                    self.experts_repacked += repack_if_left_raw(self.model, group)
        self._reset_prefix_cache()
        self.version = version
        self._weights_valid = True

    def _write_inplace(self, incoming: list[tuple[str, torch.Tensor]], version: int, swap: bool) -> None:
        params = dict(self.model.named_parameters())
        if not self._weights_valid:  # discarded (level-2 sleep) or dummy: what is not written is garbage
            missing = uncovered_params(params, (name for name, _ in incoming))
            if missing:
                raise RuntimeError(
                    f"refusing to activate version {version}: the engine's weights were discarded (level-2 "
                    f"sleep or dummy init) and the publication does not write {len(missing)} of its "
                    f"parameters, which would serve reallocated garbage: {missing[:8]}; the reshard plan must "
                    "cover every vLLM parameter (or sleep at rollout.sleep_level=1)"
                )
        targets = [target_of(params, name) for name, _ in incoming]  # check everything before writing
        for (name, t), dst in zip(incoming, targets):
            if tuple(dst.shape) != tuple(t.shape):
                raise ValueError(f"{name}: got shape {list(t.shape)}, the engine holds {list(dst.shape)}")
        with torch.no_grad():
            for (_, t), dst in zip(incoming, targets):
                if swap:
                    swap_into(dst, t)
                else:
                    dst.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        self._reset_prefix_cache()
        self.version = version
        self._weights_valid = True

    def _reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")


def uncovered_params(params: Mapping[str, torch.Tensor], incoming: Iterable[str]) -> list[str]:
    """The engine parameters (`model.named_parameters()`) that a publication of `incoming` names leaves
    unwritten, sorted. In-place delivery copies only what arrives: after a level-2 sleep every one of
    these holds whatever the reallocated memory held."""
    return sorted(set(params) - covered(dict(params), incoming))


def swap_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst` takes `src`'s values and `src` takes `dst`'s (one temporary copy of the smaller tensor at a
    time): in-place activation that keeps the version served before in the staging buffer."""
    previous = dst.detach().clone()
    dst.copy_(src)
    src.copy_(previous)
