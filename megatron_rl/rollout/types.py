"""What the rollout layer promises the loop: samples, sampling settings, and the engine protocol.

Every sample carries the policy version it was drawn with, so the loop can tell an on-policy sample
from a stale one after an asynchronous publication. A sample cut before it finished
(`rollout.partial`) is a `Partial`: its tokens so far, each with its version, continued in a later
batch under a newer one; the finished `Sample` then records the version of every token. Samples are streamed as they finish, so scoring starts while the batch is still
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
__all__ = ["FINISH_REASONS", "LOGPROBS_MODES", "Partial", "SamplingSettings", "Sample", "merged_stop_ids"]


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
    reward pool has scored the sample (loop/step/collect.py); `status` is then one of reward/result.py's
    STATUSES, and "" means not scored yet.

    `version` is the policy version of the sample's first token (its oldest). `token_versions` is None
    when every token came from that version; a sample continued after a cut (rollout.partial) holds
    one version per token, non-decreasing.
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
    token_versions: list[int] | None = None
    # Routing replay (algorithm.routing_replay): the engine's top-k experts per fed position and MoE layer,
    # [prompt + completion - 1, layers, k] uint8 (rollout/routes.py); None otherwise.
    routes: torch.Tensor | None = None
    # Multi-turn (rollout.env: rollout/turns.py): 1 on tokens the model generated, 0 on the environment's
    # observations (context, never trained); None: every completion token was generated.
    loss_mask: list[int] | None = None
    turns: int = 1
    env_seconds: float = 0.0  # time the trajectory's environment spent on its turns
    # The engine's own view, per turn: (completion tokens up to the turn's end, digest of the context the
    # engine reports it ran plus the turn's output). `token_exact` checks the trainer's ids against it.
    engine_spans: list[tuple[int, str]] | None = None
    error: str = ""  # an environment's error that ended the trajectory (status env_error)
    # A learned reward model's score (reward.model_checkpoint), before the recipe's weights; None without one.
    model_score: float | None = None

    def __post_init__(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != len(self.token_ids):
            raise ValueError(
                f"sample ({self.prompt_index}, {self.sample_index}): a loss mask of {len(self.loss_mask)} for "
                f"{len(self.token_ids)} tokens"
            )
        if self.routes is not None and self.routes.shape[0] != len(self.prompt_ids) + len(self.token_ids) - 1:
            raise ValueError(
                f"sample ({self.prompt_index}, {self.sample_index}): routes for {self.routes.shape[0]} positions, "
                f"expected {len(self.prompt_ids) + len(self.token_ids) - 1} (prompt + completion - 1)"
            )
        if self.token_versions is not None:
            _check_versions(self.token_versions, len(self.token_ids), self.prompt_index, self.sample_index)
            if self.token_versions and self.token_versions[0] != self.version:
                raise ValueError(
                    f"sample ({self.prompt_index}, {self.sample_index}): version {self.version} is not the "
                    f"version of its first token ({self.token_versions[0]})"
                )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}; got {self.finish_reason!r}")
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"sample ({self.prompt_index}, {self.sample_index}): {len(self.logprobs)} log-probs for "
                f"{len(self.token_ids)} tokens; the engine must return one log-prob per sampled token"
            )

    @property
    def versions(self) -> list[int]:
        """The policy version of each completion token."""
        if self.token_versions is not None:
            return list(self.token_versions)
        return [self.version] * len(self.token_ids)

    @property
    def sequence(self) -> list[int]:
        """Prompt followed by completion: what the trainer scores teacher-forced."""
        return self.prompt_ids + self.token_ids

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def generated_mask(self) -> list[int]:
        """1 on each completion token the model generated, 0 on observations (multi-turn)."""
        return list(self.loss_mask) if self.loss_mask is not None else [1] * len(self.token_ids)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else len(self.token_ids)

    @property
    def observation_tokens(self) -> int:
        return len(self.token_ids) - self.generated_tokens


def token_digest(ids: Sequence[int]) -> str:
    """A digest of a token-id sequence (the engine's view of a turn: Sample.engine_spans)."""
    import hashlib
    import struct

    return hashlib.blake2b(struct.pack(f"<{len(ids)}q", *ids), digest_size=16).hexdigest()


def token_exact(sample: Sample, trained_ids: Sequence[int]) -> bool:
    """True when `trained_ids` (what the trainer scores: the prompt and completion) hold, at every turn's
    end, exactly the ids the engine reported it ran and produced; False for a sample with no record of
    the engine's view (fail closed: what cannot be shown exact is not)."""
    if sample.engine_spans == [] and not sample.token_ids:  # no turn ran (its environment failed to start)
        return list(trained_ids) == list(sample.prompt_ids)
    if not sample.engine_spans:
        return False
    p = sample.prompt_len
    return all(
        end <= len(trained_ids) - p and token_digest(list(trained_ids[: p + end])) == digest
        for end, digest in sample.engine_spans
    )


def _check_versions(versions: Sequence[int], tokens: int, prompt_index: int, sample_index: int) -> None:
    if len(versions) != tokens:
        raise ValueError(
            f"sample ({prompt_index}, {sample_index}): {len(versions)} token versions for {tokens} tokens"
        )
    if any(b < a for a, b in zip(versions, versions[1:])):
        raise ValueError(
            f"sample ({prompt_index}, {sample_index}): token versions go backwards ({list(versions)}); a "
            "continued sample only ever gains tokens from newer versions"
        )


@dataclass
class Partial:
    """A sample cut before it finished (rollout.partial): its prompt, and its tokens so far with their
    log-probs and versions. Continued as a request of prompt + tokens so far, for the tokens left under
    the sample's cap; never trained until it finishes. With no tokens it is a fresh request: the engine
    submits every sample this way (rollout/vllm_engine.py `generate_requests`)."""

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    max_tokens: int  # the whole completion's cap, as when it was first submitted

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"partial sample ({self.prompt_index}, {self.sample_index}): {len(self.logprobs)} "
                f"log-probs for {len(self.token_ids)} tokens"
            )
        _check_versions(self.versions, len(self.token_ids), self.prompt_index, self.sample_index)
        if len(self.token_ids) >= self.max_tokens:
            raise ValueError(
                f"partial sample ({self.prompt_index}, {self.sample_index}) holds {len(self.token_ids)} "
                f"tokens, its whole cap ({self.max_tokens}): it finished, it is not partial"
            )


@runtime_checkable
class Engine(Protocol):
    """A rollout engine in one process of an SPMD job (every rank calls the same methods)."""

    version: int  # the policy version now loaded; -1 before the first publication

    def generate_stream(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSettings | None = None
    ) -> Iterator[Sample]:
        """Yield each (prompt, sample) as soon as it finishes; n samples per prompt."""
        ...

    def requests_for(self, prompts: Sequence[Sequence[int]], n: int, max_tokens=None) -> list[Partial]:
        """n fresh requests per prompt: Partials with no tokens yet, capped per prompt."""
        ...

    def generate_requests(
        self, requests: Sequence[Partial], call_id: int | None = None, keep_partial: bool = False
    ):
        """Yield each request's sample as it finishes; a request with tokens continues them. Closing the
        stream aborts the rest, which (keep_partial) its `cut` then lists with the tokens they had."""
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
