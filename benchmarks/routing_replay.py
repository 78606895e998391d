"""Routing replay on a tiny Qwen3-MoE: the engine-vs-trainer log-prob mismatch with and without it. JSON.

    python benchmarks/routing_replay.py [--updates 4] [--engine-dtype bfloat16] [--prompts 8] [--samples 4]
                                        [--new-tokens 24] [--out FILE]

One process (world 1): megatron-core builds the policy (fp32) from the qwen3_moe HF fixture and takes
`--updates` optimizer steps on random sequences with random advantages, so the weights are no longer the
fixture's; they are exported to HF and served by a vLLM CPU engine in `--engine-dtype`, which samples
with routes recorded (rollout/routes.py). The trainer then scores the samples twice: choosing its own
experts, and replaying the engine's (trainer/replay.py). Per mode, over every completion token:
  mismatch_mean / mismatch_max   |engine log-prob - trainer log-prob|
and `routes_differ_share`: the share of (token, layer) pairs whose top-k experts the trainer's own router
chose differently from the engine's. `replayed_equals_engine` checks, per token and layer, that the
replayed forward used exactly the engine's experts (read off the router's routing map).
An engine in fp32 agrees with the fp32 trainer to rounding; bf16 makes near-ties flip.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _world1() -> None:
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", "29617")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--engine-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    _world1()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    with tempfile.TemporaryDirectory(prefix="routing-replay-") as tmp:
        return _measure(args, Path(tmp))


def _measure(args, tmp: Path) -> dict:
    """The run itself, its checkpoints under `tmp` (removed afterwards)."""
    from megatron_rl.checkpoint.export import write_hf
    from megatron_rl.config.schema import ModelConfig
    from megatron_rl.models.fixture import build_fixture
    from megatron_rl.models.spec import ModelSpec
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.rollout.vllm_engine import VLLMEngine
    from megatron_rl.trainer.gather import full_state
    from megatron_rl.trainer.hf_import import load_hf_into
    from megatron_rl.trainer.parallel import init_parallel
    from megatron_rl.trainer.policy import OptimSettings, Policy
    from tests.integration.rollout.cases import rollout_cfg

    fixture = build_fixture("qwen3_moe", tmp / "fixture")
    spec = ModelSpec.from_config(ModelConfig(hf_checkpoint=str(fixture), params_dtype="fp32"))
    state = init_parallel(ParallelLayout.over(1))
    policy = Policy(
        spec, state, optim=OptimSettings(lr=3e-3, clip_grad=1.0), micro_batch_size=1, routing_replay=True
    )
    load_hf_into(policy.model, spec, fixture, 1, 0, policy.padded_vocab)
    g = torch.Generator().manual_seed(0)
    for _ in range(args.updates):  # move the weights off the fixture's
        seqs = [
            torch.randint(0, 600, (int(n),), generator=g).tolist()
            for n in torch.randint(12, 40, (4,), generator=g)
        ]
        adv = [torch.randn(len(s) - 4, generator=g) for s in seqs]
        policy.train_step(seqs, [4] * 4, lambda lp, mb: (-(lp * mb.extras["adv"] * mb.loss_mask_BT).sum() / 100, {}),
                          extras={"adv": adv})  # fmt: skip
    trained = write_hf(full_state(policy), policy.spec, tmp / "trained", source=str(fixture))
    cfg = rollout_cfg(max_new_tokens=args.new_tokens, temperature=1.0, logprobs_mode="raw_logprobs")
    engine = VLLMEngine(cfg, trained, tp=1, seed=0, load_format="auto", dtype=args.engine_dtype, max_model_len=256,
                        record_routes=True)  # fmt: skip
    prompts = [torch.randint(0, 600, (int(n),), generator=g).tolist() for n in torch.randint(8, 30, (args.prompts,), generator=g)]  # fmt: skip
    samples = engine.generate(prompts, args.samples)
    seqs, plens = [s.sequence for s in samples], [s.prompt_len for s in samples]
    routes = [s.routes for s in samples]
    engine_lp = [torch.tensor(s.logprobs) for s in samples]
    report: dict = {"engine_dtype": args.engine_dtype, "updates": args.updates, "samples": len(samples)}
    for mode, given in (("without_replay", None), ("with_replay", routes)):
        got = policy.logprobs(seqs, plens, routes=given)
        diffs = torch.cat([(a - b).abs() for a, b in zip(got, engine_lp)])
        report[mode] = {"mismatch_mean": float(diffs.mean()), "mismatch_max": float(diffs.max()),
                        "tokens": int(diffs.numel())}  # fmt: skip
    own = _routes_used(policy, seqs, plens)
    differ = [(o.sort(-1).values != r.long().sort(-1).values).any(-1) for o, r in zip(own, routes)]
    report["routes_differ_share"] = float(torch.cat([d.flatten() for d in differ]).float().mean())
    # The replayed forward's own routing map, per token and layer, against the engine's routes.
    replayed = _routes_used(policy, seqs, plens, routes)
    report["replayed_equals_engine"] = all(
        torch.equal(a.sort(-1).values, r.long().sort(-1).values) for a, r in zip(replayed, routes)
    )
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return report


def _routes_used(policy, seqs, plens, routes=None) -> list[torch.Tensor]:
    """The experts each router used per position and layer, read off its routing map by a forward hook:
    the trainer's own choice, or with `routes` the replayed one. One sequence per forward."""
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        layer.mlp.router.register_forward_hook(lambda _m, _i, out, _l=layer.layer_number - 1: seen.__setitem__(_l, out[1]))
        for layer in policy.model.decoder.layers
    ]  # fmt: skip
    out = []
    try:
        for j, (s, p) in enumerate(zip(seqs, plens)):
            seen.clear()
            policy.logprobs([s], [p], routes=None if routes is None else [routes[j]])
            n, k = len(s), policy.spec.moe_topk
            out.append(
                torch.stack([seen[i][: n - 1].nonzero()[:, 1].view(n - 1, k) for i in sorted(seen)], 1)
            )
    finally:
        for h in hooks:
            h.remove()
    return out


if __name__ == "__main__":
    main()
