"""One in-process vLLM CPU engine, every single-engine check in one start (run by test_engine_cpu.py).

    python worker_engine.py OUT_JSON MODEL_DIR

Runs in its own process because the engine changes process state (thread binding, NUMA policy,
torch.set_num_threads) that must not leak into the pytest process. The oracle for every log-prob is
HF transformers' Qwen2 on the same state dict, with the convention of rollout/sampling.py applied
to its logits.
"""

import contextlib
import json
import logging
import os
import sys
import time

import torch

from megatron_rl.loop.placement.timeshare import TimeShare
from megatron_rl.rollout.process import make_shm_names_job_unique
from megatron_rl.rollout.sampling import apply_sampling_convention
from megatron_rl.rollout.types import SamplingSettings
from megatron_rl.rollout.vllm_engine import VLLMEngine
from megatron_rl.rollout.weights import group_fused
from tests.integration.rollout.cases import LONG_PROMPT, SPEC, peaky_hf_state, rollout_cfg

OUT, MODEL_DIR = sys.argv[1], sys.argv[2]
PROMPTS = [[1, 2, 3, 4], [10, 20, 30], [50, 60, 70, 80, 90]]


def hf_with(sd):
    from megatron_rl.models.tiny import hf_model

    m = hf_model(SPEC)
    m.load_state_dict(sd, strict=True)
    return m


def hf_logits(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


def oracle_diff(model, samples, s: SamplingSettings):
    """max |engine log-prob - convention(HF logits)[token]| and tokens outside HF's support."""
    worst, outside = 0.0, 0
    for x in samples:
        lp = apply_sampling_convention(
            hf_logits(model, x.prompt_ids, x.token_ids), s.temperature, s.top_p, s.top_k
        )
        ref = lp[torch.arange(len(x.token_ids)), torch.tensor(x.token_ids)]
        outside += int((~torch.isfinite(ref)).sum())
        fin = torch.isfinite(ref)
        worst = max(worst, (ref[fin] - torch.tensor(x.logprobs)[fin]).abs().max().item())
    return worst, outside


@contextlib.contextmanager
def vllm_warnings(text: str):
    """The messages of vLLM's log records containing `text` while the block runs (vLLM's loggers do not
    propagate to the root logger, so the handler sits on its own "vllm" logger)."""
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            if text in record.getMessage():
                seen.append(record.getMessage())

    handler = Catch(level=logging.WARNING)
    logging.getLogger("vllm").addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger("vllm").removeHandler(handler)


def error_of(fn):
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def main():
    r = {}
    eng = VLLMEngine(rollout_cfg(), MODEL_DIR, tp=1, seed=0)
    r["start_s"] = eng.start_s
    r["before_publish"] = error_of(lambda: eng.generate(PROMPTS, 1))
    sd0, sd1 = peaky_hf_state(0), peaky_hf_state(1)
    m0, m1 = hf_with(sd0), hf_with(sd1)
    t = time.perf_counter()
    eng.update_weights(sd0.items(), version=0)
    r["publish_s"] = time.perf_counter() - t

    # The sampling convention, checked against HF logits: temperature + top-p, and temperature alone.
    for name, s in {
        "t0.7_p0.8": SamplingSettings(temperature=0.7, top_p=0.8, max_new_tokens=12),
        "t1.3": SamplingSettings(temperature=1.3, max_new_tokens=12),
        "t0.7_k5_p0.9": SamplingSettings(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=12),
    }.items():
        samples = eng.generate(PROMPTS, 4, s)
        worst, outside = oracle_diff(m0, samples, s)
        r[f"convention_{name}"] = dict(
            max_abs_diff=worst,
            outside_support=outside,
            tokens=sum(len(x.token_ids) for x in samples),
            versions=sorted({x.version for x in samples}),
            distinct_per_prompt=[
                len({tuple(x.token_ids) for x in samples if x.prompt_index == p}) for p in range(3)
            ],
        )

    # Streaming: the prompt with 10 positions of room finishes (truncated) while 40-token samples run.
    long_room = [5] * (eng.max_model_len - 10)
    stream = eng.generate_stream([[1, 2, 3], long_room, [4, 5]], 3, SamplingSettings(max_new_tokens=40))
    order, unfinished_at_first = [], None
    for x in stream:
        if unfinished_at_first is None:
            unfinished_at_first = eng._engine.get_num_unfinished_requests()
        order.append(
            dict(p=x.prompt_index, n=len(x.token_ids), reason=x.finish_reason, truncated=x.truncated)
        )
    r["stream"] = dict(order=order, unfinished_at_first=unfinished_at_first, stats=eng.last_stream)

    # A stop token ends a sample with finish reason "stop", the stop token included and scored.
    greedy = eng.generate([[1, 2, 3, 4]], 1, SamplingSettings(temperature=0.0, max_new_tokens=8))[0]
    stop_id = greedy.token_ids[2]
    stopped = eng.generate(
        [[1, 2, 3, 4]], 1, SamplingSettings(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop_id,))
    )[0]
    r["stop"] = dict(
        greedy=greedy.token_ids,
        stop_id=stop_id,
        tokens=stopped.token_ids,
        reason=stopped.finish_reason,
        truncated=stopped.truncated,
        n_logprobs=len(stopped.logprobs),
        greedy_reason=greedy.finish_reason,
    )

    # Closing a stream early aborts the rest; the engine serves the next call.
    it = eng.generate_stream(PROMPTS, 2, SamplingSettings(max_new_tokens=30))
    next(it)
    r["open_stream_second_call"] = error_of(lambda: next(eng.generate_stream(PROMPTS, 1)))
    r["open_stream_update"] = error_of(lambda: eng.update_weights(sd1.items(), version=5))
    it.close()
    r["after_close_unfinished"] = eng._engine.get_num_unfinished_requests()

    # The trainer's RNG stream does not depend on generation.
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    eng.generate(PROMPTS, 2, SamplingSettings(max_new_tokens=8))
    r["rng_preserved"] = bool(torch.equal(torch.rand(4), expected))

    # Stale prefix cache, a control: a long prompt's first KV block is cached under v0; a push without
    # reset keeps it (the output disagrees with HF under the new weights); update_weights resets it.
    greedy_long = SamplingSettings(temperature=0.0, max_new_tokens=8)
    # The control reloads group by group, as one call per fused group would: vLLM then puts the old tensors
    # back on every layer a call did not write and warns once per such layer; update_weights's single call
    # for the whole publication writes every layer and warns on none.
    eng.generate([LONG_PROMPT], 1, greedy_long)
    with vllm_warnings("Failed to load weights") as per_group:
        for group in group_fused(sd1.items()):
            eng.llm.collective_rpc(
                "reload_weights", kwargs=dict(weights_iterator=iter(group), is_checkpoint_format=True)
            )
    r["failed_load_warnings_per_group"] = per_group
    stale = eng.generate([LONG_PROMPT], 1, greedy_long)
    r["stale_without_reset"] = oracle_diff(m1, stale, greedy_long)[0]
    calls = eng.reload_calls
    with vllm_warnings("Failed to load weights") as one_call:
        eng.update_weights(sd1.items(), version=1)
    r["failed_load_warnings_update"] = one_call
    r["reload_calls_per_update"] = eng.reload_calls - calls
    fresh = eng.generate([LONG_PROMPT], 1, greedy_long)
    r["fresh_after_update"] = oracle_diff(m1, fresh, greedy_long)[0]
    r["fresh_greedy_equals_hf"] = (
        fresh[0].token_ids == hf_logits(m1, LONG_PROMPT, fresh[0].token_ids).argmax(-1).tolist()
    )
    r["version_after_update"] = sorted({x.version for x in fresh})

    # Refusals that name the problem.
    r["too_long"] = error_of(lambda: eng.generate([[1] * eng.max_model_len], 1))
    r["old_version"] = error_of(lambda: eng.update_weights(sd0.items(), version=1))
    r["split_group"] = error_of(
        lambda: eng.update_weights(
            [(k, v) for k, v in sd0.items() if not k.endswith("k_proj.weight")], version=2
        )
    )

    # Time-sharing on CPU: nothing is offloaded or slept, every phase's memory is recorded.
    phases = []
    ts = TimeShare(eng, on_memory=lambda phase, mem: phases.append((phase, mem)))
    ts.to_train()
    ts.to_rollout(publish=lambda: eng.update_weights(sd0.items(), version=2))
    r["timeshare"] = dict(
        phases=[p for p, _ in phases], rss=[m["rss_gib"] for _, m in phases], sleep=eng.sleep()
    )
    r["after_timeshare"] = sorted(
        {x.version for x in eng.generate(PROMPTS, 1, SamplingSettings(max_new_tokens=4))}
    )

    # Two jobs on one host: vLLM's CPU shared-memory group names get the job's MASTER_PORT.
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    os.environ["VLLM_DIST_IDENT"] = "//"  # what every torchrun (env://) job gets
    group = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    before = _CPUSHMDistributed.make_group_name(group)
    os.environ["MASTER_PORT"] = "29123"
    r["shm_names"] = [before, make_shm_names_job_unique() and _CPUSHMDistributed.make_group_name(group)]

    # More prompt tokens than one scheduler step takes: every seeded sample still comes back, the
    # same twice (the CPU build once failed here, splitting a prefill it could not rewind).
    budget = eng.llm.vllm_config.scheduler_config.max_num_batched_tokens
    g = torch.Generator().manual_seed(1)
    many = [torch.randint(0, SPEC.vocab_size, (100,), generator=g).tolist() for _ in range(48)]

    def seeded():
        out = eng.generate_stream(many, 2, SamplingSettings(max_new_tokens=4), call_id=7)
        return sorted(out, key=lambda x: (x.prompt_index, x.sample_index))

    first, again = seeded(), seeded()
    r["over_budget"] = dict(
        budget=budget,
        prompt_tokens=sum(len(p) * 2 for p in many),
        samples=len(first),
        same=[x.token_ids for x in first] == [x.token_ids for x in again],
    )

    # Multi-turn: turns of many trajectories interleaved on this engine (turn_checks.py), under version 2 (sd0)
    from tests.integration.rollout.turn_checks import turn_checks

    r["turns"] = turn_checks(eng, m0)

    # Throughput (for the closing note): 16 prompts x 4 samples x 32 tokens, after one warm-up call.
    g = torch.Generator().manual_seed(0)
    bench = [torch.randint(0, SPEC.vocab_size, (16,), generator=g).tolist() for _ in range(16)]
    eng.generate(bench, 4, SamplingSettings(max_new_tokens=32))
    eng.generate(bench, 4, SamplingSettings(max_new_tokens=32))
    r["bench"] = eng.last_stream

    # Every request above asked for log-probs (sampled and, here, prompt ones): none compiled a kernel
    from vllm.v1.sample import sampler

    from megatron_rl.rollout.process import count_at_least
    from megatron_rl.rollout.scoring import prompt_logprobs

    r["prompt_logprobs"] = len(prompt_logprobs(eng, [[1, 2, 3, 4, 5]])[0])
    r["compiled_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    r["eager_ranks"] = sampler.batched_count_greater_than is count_at_least

    # Last, an engine that fails inside its step: its live model taken from its runner, as a crashed device
    # leaves it. The call ends with the engine's error, typed for the job's failover (system/failover.py).
    from megatron_rl.system.failover import exit_code_for

    eng._engine.model_executor.driver_worker.worker.model_runner.model = None
    try:
        eng.generate(bench[:2], 1, SamplingSettings(max_new_tokens=4))
        r["crash"] = None
    except Exception as e:
        r["crash"] = dict(
            kind=type(e).__name__, message=str(e), cause=type(e.__cause__).__name__, code=exit_code_for(e)
        )
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
