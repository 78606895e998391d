"""Check that the rollout engines and the trainer agree on log-probs, for a recipe's model and layout.

    torchrun --nproc-per-node 2 tools/check_logprobs.py grpo_tiny_cpu [OVERRIDES ...] [--json out.json]

One published version, end to end as the loop runs it: the trainer (the recipe's TP x PP, random
init or model.hf_checkpoint) publishes through the reshard publisher into colocated vLLM engines
started from config.json alone; the engines sample completions for random token prompts (their
exact token ids and per-token log-probs are kept); the trainer scores the same tokens teacher-forced
with the convention of rollout.logprobs_mode; rollout.logprob_check reports mean and max |diff|,
the probability ratio exp(diff) (mean, p99, max) and the sequences beyond the max threshold.
Prints one JSON object (rank 0); exits 1 when the max or the mean |diff| is beyond the thresholds the
recipe's dtypes set (rollout/agreement.py; `--threshold` sets the max one) -- the loop's own verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.rollout.logprob_check import bind_trainer_logprobs, check_samples
from megatron_rl.rollout.types import SamplingSettings


def gather_engine_samples(engine, prompts, n: int, sampling: SamplingSettings, cpu_group=None) -> list:
    """Sample on every engine and give every rank all engines' samples (each engine's once: from its
    TP rank 0), so every trainer rank scores the same batch. Every rank calls this with its engine's
    prompts (identical within an engine's TP group). The samples are host objects: `cpu_group` is the
    gloo group over every rank (ParallelState.cpu_group)."""
    local = engine.generate(prompts, n, sampling)
    every: list = [None] * dist.get_world_size(cpu_group)
    dist.all_gather_object(every, local if dist.get_rank() % engine.tp == 0 else [], group=cpu_group)
    return [s for part in every for s in part]


def publish_and_check(
    policy, engine, publisher, prompts, n: int, sampling: SamplingSettings, step: int, threshold: float
) -> dict:
    """Publish the trainer's weights, sample on every engine, score all samples on the trainer."""
    t = time.perf_counter()
    res = publisher.publish(policy.named_parameters_global(), step=step)
    publish_s = time.perf_counter() - t
    if not res.activated:
        raise RuntimeError(f"publication of version {res.version} was rejected: {res.problems}")
    samples = gather_engine_samples(engine, prompts, n, sampling, policy.state.cpu_group)
    stream = dict(engine.last_stream)
    report = check_samples(
        samples, bind_trainer_logprobs(policy.logprobs, engine.logprobs_mode, sampling), threshold
    )
    return dict(
        report=report, version=res.version, publish_s=publish_s, engine_stream=stream, samples=samples
    )


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(count)]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rollout.temperature=0.7")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per engine")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument(
        "--samples", type=int, default=0, help="samples per prompt (default rollout.samples_per_prompt)"
    )
    ap.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="max |diff| in nats (default: the recipe's, rollout/agreement.py; its mean threshold applies too)",
    )
    ap.add_argument("--delivery", default="loader", choices=["loader", "inplace"])
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)

    from megatron_rl.check.recipe import ConfigError, validate_recipe
    from megatron_rl.config.load import load_recipe
    from megatron_rl.models.dtypes import hf_dtype_name
    from megatron_rl.models.tiny import hf_config
    from megatron_rl.reshard.publish import Publisher
    from megatron_rl.rollout.agreement import dtypes_of, problems
    from megatron_rl.rollout.sink import VLLMEngineSink
    from megatron_rl.rollout.vllm_engine import VLLMEngine
    from megatron_rl.trainer.parallel import init_parallel
    from megatron_rl.trainer.policy import Policy

    try:  # the driver's own check: a layout whose engines do not cover every rank is refused here
        run = validate_recipe(load_recipe(args.recipe, args.overrides))  # resolved once: run/resolve.py
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    rc, lay, spec = run.recipe, run.layout, run.spec
    ro = rc.rollout
    st = init_parallel(lay, seed=rc.seed)
    policy = Policy(spec, st)
    if rc.model.hf_checkpoint:
        from megatron_rl.trainer.hf_import import load_hf_into

        load_hf_into(
            policy.model,
            spec,
            rc.model.hf_checkpoint,
            lay.tp,
            st.tp_rank,
            policy.padded_vocab,
            etp=lay.etp,
            etp_rank=st.expert_coord.etp,
        )
    max_len = min(spec.max_position_embeddings, args.prompt_len + ro.max_new_tokens)
    model_dir = tempfile.TemporaryDirectory()  # config.json only; the publication brings the weights
    hf_config(spec, hf_dtype_name(spec.params_dtype)).save_pretrained(model_dir.name)
    engine = VLLMEngine(
        ro,
        model_dir.name,
        tp=lay.engine_tp,
        seed=ro.seed,
        engine_index=st.layout.engine_coord(st.env.rank).engine,
        max_model_len=max_len,
        dtype=hf_dtype_name(dtypes_of(rc)[1]),
    )
    pub = Publisher(
        st.layout,
        spec,
        sink=VLLMEngineSink(engine, args.delivery),
        delivery=args.delivery,
        cpu_group=st.cpu_group,
    )
    sampling = run.sampling
    prompts = random_prompts(
        args.prompts, args.prompt_len, spec.vocab_size, seed=rc.seed + engine.engine_index
    )
    thresholds = run.thresholds
    if args.threshold is not None:
        thresholds = replace(thresholds, max_gap=args.threshold, source="--threshold (max)")
    threshold = thresholds.max_gap
    out = publish_and_check(
        policy, engine, pub, prompts, args.samples or ro.samples_per_prompt, sampling, 0, threshold
    )
    result = dict(
        recipe=rc.name,
        engine_start_s=engine.start_s,
        publish_s=out["publish_s"],
        engine_stream=out["engine_stream"],
        **out["report"],
        thresholds=thresholds.as_dict(),
        problems=problems(out["report"], thresholds),
    )
    if dist.get_rank() == 0:
        print(json.dumps(result, indent=1))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    dist.barrier()
    model_dir.cleanup()
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
