"""Rollout: engines that generate samples with a published policy version, and their contract.

    types.py          Sample, SamplingSettings, the Engine protocol
    vllm_engine.py    VLLMEngine: colocated vLLM (official GPU build, pinned CPU build), streaming
    sink.py           VLLMEngineSink: the reshard publisher's stage/activate onto a live engine
    sampling.py       the log-prob convention and the trainer-side transform that matches it
    logprob_check.py  engine vs trainer log-probs on the same tokens (every step, and tools/)
    timeshare.py      trainer offload / engine sleep around each phase, memory per phase
    process.py        the engine's side effects on the trainer's process, contained
    weights.py        HF tensors grouped by vLLM's fused groups

Importing this package loads neither vLLM nor megatron-core.
"""

from megatron_rl.rollout.types import Engine, Sample, SamplingSettings

__all__ = ["Engine", "Sample", "SamplingSettings"]
