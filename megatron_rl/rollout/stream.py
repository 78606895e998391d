"""What one generation call yields: the stream of finished samples, and vLLM's outputs made samples.

A `Stream` hands out each request's `Sample` as it finishes; closed early, it aborts the rest and (with
`keep_partial`, rollout.partial) lists the unfinished requests as `Partial`s holding the tokens they had.
The conversions below read vLLM's `RequestOutput`s: DELTA outputs are appended step by step, a finished
request becomes a `Sample` with one policy version per token.
"""

from __future__ import annotations

from collections.abc import Iterator

from megatron_rl.rollout.types import Partial, Sample, token_digest


class Stream(Iterator[Sample]):
    """The samples of one `generate_requests` call as they finish. `close()` aborts what still runs (every
    rank of an engine closes at the same sample); with keep_partial, `cut` then lists those requests as
    `Partial`s holding the tokens they had, to be continued later."""

    def __init__(self, gen: Iterator[Sample], requests: list, cut: list[Partial], keep_partial: bool):
        self._gen, self._requests, self.cut, self._keep = gen, requests, cut, keep_partial
        self._started = False

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Sample:
        self._started = True
        return next(self._gen)

    def close(self) -> None:
        if not self._started and self._keep:  # closed before any request entered the engine
            self.cut.extend(r for _, _, r, _ in self._requests)
        self._gen.close()


def append_delta(out, tokens: list[int], logprobs: list[float]) -> None:
    completion = out.outputs[0]
    ids = list(completion.token_ids)
    if ids and (completion.logprobs is None or len(completion.logprobs) != len(ids)):
        raise RuntimeError(f"request {out.request_id}: the engine returned no per-token log-probs")
    tokens += ids
    logprobs += [float(pos[tok].logprob) for tok, pos in zip(ids, completion.logprobs or [])]


def extended(r: Partial, tokens: list[int], logprobs: list[float], version: int) -> Partial:
    """The request `r` with the tokens this call added, each of `version`."""
    return Partial(
        r.prompt_index,
        r.sample_index,
        list(r.prompt_ids),
        list(r.token_ids) + tokens,
        list(r.logprobs) + logprobs,
        list(r.versions) + [version] * len(tokens),
        r.max_tokens,
    )


def finish_reason(out) -> str:
    """A finished request's reason, "stop" or "length"; anything else (an abort) is an error."""
    reason = out.outputs[0].finish_reason
    if reason not in ("stop", "length"):
        raise RuntimeError(f"request {out.request_id} ended with finish reason {reason!r} (aborted?)")
    return reason


def to_sample(out, r: Partial, tokens: list[int], logprobs: list[float], version: int) -> Sample:
    reason = finish_reason(out)
    versions = list(r.versions) + [version] * len(tokens)
    first = versions[0] if versions else version
    # The engine's own view: the context it reports it ran (prompt and tokens held) and what it added
    ran = getattr(out, "prompt_token_ids", None)
    spans = [(len(r.token_ids) + len(tokens), token_digest(list(ran) + tokens))] if ran is not None else None
    return Sample(
        prompt_index=r.prompt_index,
        sample_index=r.sample_index,
        prompt_ids=list(r.prompt_ids),
        token_ids=list(r.token_ids) + tokens,
        logprobs=list(r.logprobs) + logprobs,
        finish_reason=reason,
        truncated=reason == "length",
        version=first,
        token_versions=versions if any(v != first for v in versions) else None,
        engine_spans=spans,
    )
