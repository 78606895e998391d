"""Rollout: engines that generate samples with a published policy version, and their contract.

    types.py          Sample, SamplingSettings, the Engine protocol
    vllm_engine.py    VLLMEngine: colocated vLLM (official GPU build, pinned CPU build), streaming
    engine_weights.py how a live engine takes a publication: one reload call, in place on GPU, restore
    stream.py         the samples of one generate call as they finish
    scoring.py        the engine's own log-probs of given sequences (a prefill: the publication probe)
    sink.py           VLLMEngineSink: the reshard publisher's stage/activate (and roll-back) on a live engine
    delivery.py       how a publication reaches the engine, and the sleep level that follows
    sampling.py       the log-prob convention and the trainer-side transform that matches it
    convention.py     which sampling settings the trainer's log-probs can follow
    logprob_check.py  engine vs trainer log-probs on the same tokens (every step, and tools/)
    agreement.py      the thresholds that comparison is judged by, set by the dtypes
    process.py        the engine's side effects on the trainer's process, contained
    weights.py        HF tensors grouped by vLLM's fused groups
    routes.py, moe_reload.py  the MoE engine's recorded routes and its CPU reload's repacking

Importing this package loads neither vLLM nor megatron-core.
"""

from megatron_rl.rollout.types import Engine, Sample, SamplingSettings

__all__ = ["Engine", "Sample", "SamplingSettings"]
