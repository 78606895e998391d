"""The engine's own log-probs of given token sequences: a prefill, no sampling.

For the log-prob probe of a publication (loop/placement/probe.py): every position t > 0 of a sequence is scored
from tokens [0, t), the same alignment as the trainer's teacher-forced log-probs with a one-token
prompt. vLLM computes prompt log-probs from the raw logits in every `logprobs_mode` (no temperature, no
top-p: its sampling processors do not apply to prompt tokens), so the trainer scores them at
temperature 1. One forward of the engine, however long the sequences: a probe costs a prefill, not a
decode loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_rl.rollout.process import preserved_rng


def prompt_logprobs(engine, sequences: Sequence[Sequence[int]], tag: str = "score") -> list[list[float]]:
    """Per sequence, the log-probs of its tokens 1..n-1 under the version `engine` serves now (an
    in-process VLLMEngine; every rank of the engine calls it with the same sequences)."""
    from vllm import SamplingParams

    engine._check_ready()
    llm = engine.llm
    params = SamplingParams(
        n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, logprobs=None, ignore_eos=True
    )
    ids = [f"{tag}-{i}" for i in range(len(sequences))]
    for seq in sequences:
        if len(seq) < 2 or len(seq) >= engine.max_model_len:
            raise ValueError(
                f"a scored sequence needs 2 to {engine.max_model_len - 1} tokens; got {len(seq)}"
            )
    out: dict[str, list[float]] = {}
    with preserved_rng():
        renderer = getattr(llm, "renderer", None)  # builds without it take the raw token prompt
        prompts = [{"prompt_token_ids": [int(t) for t in seq]} for seq in sequences]
        prompts = renderer.render_cmpl(prompts) if renderer is not None else prompts
        for rid, prompt in zip(ids, prompts):
            llm.add_request(rid, prompt, params)
        while len(out) < len(ids):
            if not llm.has_unfinished_requests():
                raise RuntimeError(f"the engine dropped {len(ids) - len(out)} scoring requests")
            for o in llm.step():
                if o.finished and o.request_id in ids:
                    seq = sequences[ids.index(o.request_id)]
                    scored = o.prompt_logprobs or []
                    # position 0 has no log-prob (None); position t holds {token: Logprob} for seq[t]
                    out[o.request_id] = [
                        float(pos[int(tok)].logprob) for pos, tok in zip(scored[1:], seq[1:])
                    ]
    return [out[rid] for rid in ids]
