"""What the rollout layer promises the loop: samples, sampling settings, and the engine protocol.

Every sample carries the policy version it was drawn with, so the loop can tell an on-policy sample
from a stale one after an asynchronous publication, and the log-prob check can refuse a batch that
mixes versions. Samples are streamed as they finish, so scoring starts while the batch is still
generating (a 16k-token tail would otherwise hold every short completion back).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

from megatron_rl.rollout.convention import LOGPROBS_MODES, convention_problems

FINISH_REASONS = ("stop", "length")
__all__ = ["FINISH_REASONS", "LOGPROBS_MODES", "SamplingSettings", "Sample", "merged_stop_ids"]


def merged_stop_ids(recipe_ids: Sequence[int], checkpoint_ids: Sequence[int] = ()) -> tuple[int, ...]:
    """The ids an engine stops at: the recipe's and the checkpoint's, sorted, each once."""
    return tuple(sorted({int(t) for t in recipe_ids} | {int(t) for t in checkpoint_ids}))


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are drawn. `logprobs_mode` is an engine setting (fixed at construction).

    top_k <= 0 and top_p == 1 switch those filters off. There is no EOS by default: engines run
    without a tokenizer (token-id prompts), so every id that ends a completion is a stop id: the
    recipe's `rollout.stop_token_ids` and, with `model.hf_checkpoint`, the checkpoint's end ids
    (models/checkpoint.py `stop_token_ids`), read once when the engine is built.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Greedy (temperature 0) is allowed here, for evaluation; a recipe's check asks for > 0.
        problems = convention_problems("processed_logprobs", self.temperature, self.top_p, -1, training=False)
        if problems:
            raise ValueError(str(problems[0]))
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1; got {self.max_new_tokens}")
        object.__setattr__(self, "top_k", self.top_k if self.top_k > 0 else -1)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @classmethod
    def from_config(cls, cfg, checkpoint_stop_ids: Sequence[int] = ()) -> SamplingSettings:
        """The recipe's sampling (cfg: config.schema.RolloutConfig), stopping also at the checkpoint's ids."""
        return cls(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=cfg.max_new_tokens,
            stop_token_ids=merged_stop_ids(cfg.stop_token_ids, checkpoint_stop_ids),
        )

    @property
    def filters_support(self) -> bool:
        """True when top-p/top-k can exclude tokens, i.e. the behaviour distribution is truncated."""
        return self.top_p < 1.0 or self.top_k > 0


@dataclass
class Sample:
    """One finished completion, and later its score: one type from the engine to the loss.

    `logprobs[i]` is the engine's log-probability of `token_ids[i]` under the convention of the
    engine's `logprobs_mode` (see rollout/sampling.py). `truncated` is True when the engine stopped
    the sample at its length cap (finish reason "length"), not when it merely ended there.
    `reward` and `status` are left at their defaults by the engine and set by the loop once the
    reward pool has scored the sample (loop/collect.py); `status` is then one of reward/result.py's
    STATUSES, and "" means not scored yet.
    """

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    truncated: bool
    version: int
    reward: float = 0.0
    status: str = ""

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}; got {self.finish_reason!r}")
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"sample ({self.prompt_index}, {self.sample_index}): {len(self.logprobs)} log-probs for "
                f"{len(self.token_ids)} tokens; the engine must return one log-prob per sampled token"
            )

    @property
    def sequence(self) -> list[int]:
        """Prompt followed by completion: what the trainer scores teacher-forced."""
        return self.prompt_ids + self.token_ids

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


@runtime_checkable
class Engine(Protocol):
    """A rollout engine in one process of an SPMD job (every rank calls the same methods)."""

    version: int  # the policy version now loaded; -1 before the first publication

    def generate_stream(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSettings | None = None
    ) -> Iterator[Sample]:
        """Yield each (prompt, sample) as soon as it finishes; n samples per prompt."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load full HF-named tensors (whole fused groups) and make `version` the active policy."""
        ...

    def sleep(self) -> bool:
        """Release memory for the trainer; True if memory was actually released."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Bring back 'weights' and/or 'kv_cache' (None = both); True if memory was reallocated."""
        ...
