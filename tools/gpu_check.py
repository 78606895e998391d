"""One-GPU check of the trainer's GPU path, for the day a device is lent (~10 min on one H200). Prints JSON.

    python tools/gpu_check.py                      # on the GPU machine: torch + megatron-core only
    python tools/gpu_check.py --device cpu         # dry run here (tiny models; the same code path)

The report goes to outputs/gpu_check-<time>.json under the repository (or --out) and to stdout.

World size 1, no vLLM. fp32 means fp32: TF32 is turned off in torch, cuBLAS (transformer-engine's fp32
GEMMs) and Triton before CUDA starts (models/precision.py), and measured on the device afterwards.
Each check runs the package's own code, as the loop calls it:
  precision the fp32 settings in force, and whether an fp32 GEMM through torch and through TE still
            carries TF32's error (it fails if so: the fp32 checks below then use a TF32 allowance,
            FP32_TOL_TF32, and say so, so their result still tells a bug from TF32);
  hf        HF import + log-prob agreement with HF transformers on the same random checkpoint
            (fp32: <= 1e-4; bf16 stated apart: rounding gives ~1e-2), and whether CPU patches ran;
  train     one real `train_step` with the loop's GRPO loss (its per-token extras made on the host
            by loop/step/rl_batch.py, as in train.py) and KL to a frozen reference that lives on the host
            between uses (algorithm.reference=offload);
  preempt   SIGUSR1 to this process, agreed on the CPU group;
  publish   a publication into an in-memory sink in both deliveries (inplace, loader);
  ckpt      async checkpoint save, then load into perturbed weights (weights must come back);
  telemetry the phase timer's CUDA branch (peak allocated per phase);
  moe       Qwen3-MoE at EP1 (fp32) against transformers (<= 1e-4), and one update;
  mfu       bf16 forward+backward of a ~1B model through the real train_step (tiny on CPU), timed:
            MFU = 6 x params x tokens / time / peak.
A failing check is reported with its error and the others still run; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron_rl.models.precision import strict_fp32, tf32_in_effect  # noqa: E402
from megatron_rl.models.tiny import tiny_spec  # noqa: E402

FP32_TOL = 1e-4  # fp32 log-probs vs transformers (CPU: ~1e-6)
# Only when TF32 is measured in effect despite strict_fp32(): TF32 keeps fp16's 10 mantissa bits, an
# eighth of bf16's rounding error (~1e-2 on these models), so a correct model stays within 5e-3.
FP32_TOL_TF32 = 5e-3

TINY = tiny_spec(
    name="gpu_check_tiny", vocab_size=1000, make_vocab_size_divisible_by=128, max_position_embeddings=512
)
ONE_B = replace(
    TINY,
    name="llama_1b",
    family="llama",
    num_layers=16,
    hidden_size=2048,
    ffn_hidden_size=8192,
    num_attention_heads=32,
    num_query_groups=8,
    head_dim=64,
    vocab_size=128256,
    qkv_bias=False,
    max_position_embeddings=4096,
    params_dtype="bf16",
)
ALGO = SimpleNamespace(
    loss_agg="token-mean",
    kl_in_reward=False,
    kl_coef=0.01,
    kl_estimator="k3",
    clip_low=0.2,
    clip_high=0.28,
    truncated_is_cap=2.0,
    overlong="none",
    overlong_penalty_tokens=0,
    advantage_std_norm=True,
)


def _init():
    for k, v in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", "29591")
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.trainer.parallel import init_parallel, launched_world

    return init_parallel(ParallelLayout.over(launched_world(), 1, 1))


def _policy(spec, state, dtype=None, optim=True, mbs=2, recompute="none"):
    from megatron_rl.trainer.policy import OptimSettings, Policy

    settings = OptimSettings(lr=1e-4) if optim else None
    state = replace(state, layout=state.layout.with_(recompute=recompute))
    return Policy(spec, state, dtype, settings, mbs)


def _samples(spec, n_prompts=2, n=4, prompt_len=12, max_new=24, seed=0):
    """Scored samples as the loop holds them (rewards, engine log-probs), deterministic."""
    from megatron_rl.rollout.types import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(n_prompts):
        prompt = torch.randint(0, spec.vocab_size, (prompt_len,), generator=g).tolist()
        for s in range(n):
            length = int(torch.randint(4, max_new + 1, (1,), generator=g))
            tokens = torch.randint(0, spec.vocab_size, (length,), generator=g).tolist()
            logprobs = (-3.0 * torch.rand(length, generator=g)).tolist()
            out.append(
                Sample(p, s, prompt, tokens, logprobs, "stop", False, 1, reward=float(s % 2), status="ok")
            )
    return out


def _hf_logprobs(ckpt, seqs, plens) -> list[torch.Tensor]:
    """transformers' own log-probs of the completions: the oracle of the trainer's."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ref = []
    for s, p in zip(seqs, plens):
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([s])).logits[0].float(), -1)
        ref.append(lp[torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:])])
    return ref


def check_precision(state, settings: dict) -> dict:
    measured = tf32_in_effect(state.device)
    tol = FP32_TOL_TF32 if measured["tf32"] else FP32_TOL
    why = "TF32 measured in effect despite the settings" if measured["tf32"] else "IEEE fp32 measured"
    return {"ok": not measured["tf32"], "settings": settings, "measured": measured, "fp32_tolerance": tol,
            "fp32_tolerance_why": why}  # fmt: skip


def check_hf(state, tmp: Path, on_gpu: bool, tol: float = FP32_TOL) -> dict:

    from megatron_rl.models.tiny import write_hf_checkpoint
    from megatron_rl.trainer.cpu_compat import applied_patches
    from megatron_rl.trainer.hf_import import load_hf_into

    ckpt = write_hf_checkpoint(TINY, tmp / "tiny")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, TINY.vocab_size, (n,), generator=g).tolist() for n in (33, 57, 12, 40)]
    plens = [5, 9, 3, 20]
    ref = _hf_logprobs(ckpt, seqs, plens)
    diffs = {}
    for dtype in ("fp32", "bf16") if on_gpu else ("fp32",):
        pol = _policy(TINY, state, dtype, optim=False)
        load_hf_into(pol.model, TINY, ckpt, 1, 0, pol.padded_vocab)
        got = pol.logprobs(seqs, plens)
        diffs[dtype] = max((a.cpu() - b).abs().max().item() for a, b in zip(got, ref))
    ok = diffs["fp32"] <= tol and (applied_patches() == []) == on_gpu
    return {
        "ok": ok,
        "max_abs_diff_vs_hf": diffs,
        "fp32_tolerance": tol,
        "cpu_patches_applied": applied_patches(),
    }


def check_train(state, timer) -> dict:
    """The loop's trainer half: old and reference log-probs, advantages, one update with the GRPO loss."""
    from megatron_rl.loop.step.rl_batch import (
        advantages_with_kl,
        global_normaliser,
        grpo_loss_fn,
        loss_mask_keep,
        minibatch_extras,
    )

    policy = _policy(TINY, state)
    reference = _policy(TINY, state, optim=False)
    with torch.no_grad():
        for (_, p), (_, q) in zip(reference.named_parameters_global(), policy.named_parameters_global()):
            p.copy_(q)
    reference.offload_between_uses = True
    moved = reference.weights_to_host()
    samples = _samples(TINY)
    idx = list(range(len(samples)))
    seqs, plens = [s.sequence for s in samples], [s.prompt_len for s in samples]
    with timer.phase("old_logprobs"):
        old = dict(zip(idx, policy.logprobs(seqs, plens)))
    with timer.phase("ref_logprobs"):
        ref = dict(zip(idx, reference.logprobs(seqs, plens)))
    adv = advantages_with_kl(samples, 4, ALGO, 24, None)
    keep = loss_mask_keep(samples, ALGO)
    loss_fn = grpo_loss_fn(ALGO, 24, global_normaliser(samples, idx, keep, ALGO.loss_agg))
    extras = minibatch_extras(samples, idx, adv, keep, old, ref)
    before = {n: p.detach().clone() for n, p in policy.named_parameters_global()}
    metrics = policy.train_step(seqs, plens, loss_fn, extras=extras, timer=timer)
    moved_by = max((p.detach() - before[n]).abs().max().item() for n, p in policy.named_parameters_global())
    ok = (
        metrics["update_successful"] == 1.0 and moved_by > 0 and torch.isfinite(torch.tensor(metrics["loss"]))
    )
    ok = bool(ok) and reference.weights_on_host == moved
    return {
        "ok": ok,
        "metrics": metrics,
        "max_param_change": moved_by,
        "reference_on_host_between_uses": reference.weights_on_host,
        "policy": policy,
        "reference": reference,
    }


def check_preempt(state) -> dict:
    from megatron_rl.checkpoint.preempt import Preemption

    pre = Preemption(state.cpu_group)
    before = pre.requested()
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.1)
    after = pre.requested()
    return {"ok": (before, after) == (False, True), "before": before, "after_signal": after}


def check_publish(policy, spec) -> dict:
    from megatron_rl.models.hf import megatron_full_to_hf
    from megatron_rl.parallel.layout import ParallelLayout
    from megatron_rl.reshard.publish import InMemorySink, Publisher

    out = {"ok": True}
    for delivery in ("inplace", "loader"):
        sink = InMemorySink()
        pub = Publisher(ParallelLayout(), spec, sink=sink, delivery=delivery)
        res = pub.publish(policy.named_parameters_global(), step=0)
        served = dict(sink.tensors())
        entry = {"activated": res.activated, "tensors": len(served), "problems": res.problems[:3]}
        if delivery == "loader":  # HF names: compare with the trainer's weights converted by hand
            want = {}
            for name, p in policy.named_parameters_global():
                want.update(megatron_full_to_hf(spec, name, p.detach()))
            entry["max_abs_diff"] = max(
                (served[k].float() - want[k].float()).abs().max().item() for k in served
            )
            entry["ok"] = res.activated and set(served) <= set(want) and entry["max_abs_diff"] == 0.0
        else:
            entry["ok"] = res.activated and len(served) > 0
        out[delivery] = entry
        out["ok"] = out["ok"] and entry["ok"]
    return out


def check_ckpt(policy, reference, tmp: Path) -> dict:
    import torch.distributed as dist

    from megatron_rl.checkpoint.resume import load
    from megatron_rl.checkpoint.save import Checkpointer
    from megatron_rl.data.synthetic import ArithmeticTask

    procs = SimpleNamespace(rank=0, is_main=True)
    task = ArithmeticTask(seed=0)
    saver = Checkpointer(tmp / "ckpt", procs, keep_last=2, async_save=True)
    run_state = {"step": 1, "version": 1, "task": task.state(), "world_size": dist.get_world_size()}
    want = {n: p.detach().clone() for n, p in policy.named_parameters_global()}
    t0 = time.perf_counter()
    path = saver.save(1, policy, reference, run_state)
    blocking = time.perf_counter() - t0
    saver.wait()
    saver.close()
    with torch.no_grad():
        for _, p in policy.named_parameters_global():
            p.add_(1.0)
    reference.weights_to_device()
    load(path, procs.rank, policy, reference, task)
    err = max((p.detach() - want[n]).abs().max().item() for n, p in policy.named_parameters_global())
    return {"ok": err == 0.0 and path.exists(), "blocking_s": blocking, "max_abs_diff_after_load": err}


def check_mfu(state, spec, peak_tflops: float, seq_len: int, micro_batch: int, iters: int, timer) -> dict:
    dtype = "bf16" if torch.cuda.is_available() else "fp32"
    policy = _policy(spec, state, dtype, mbs=micro_batch)
    params = sum(p.numel() for p in policy.model.parameters())
    seqs = [torch.randint(0, spec.vocab_size, (seq_len,)).tolist() for _ in range(micro_batch * 2)]
    plens = [1] * len(seqs)
    tokens = sum(len(s) for s in seqs)

    def loss(lp, mb):  # a likelihood step: the MFU is the model's, not the loss's
        return -(lp * mb.loss_mask_BT).sum() / tokens, {}

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    policy.train_step(seqs, plens, loss)  # warm-up
    sync()
    t0 = time.perf_counter()
    with timer.phase("train_fwd_bwd"):
        for _ in range(iters):
            policy.train_step(seqs, plens, loss)
        sync()
    dt = (time.perf_counter() - t0) / iters
    achieved = 6 * params * tokens / dt / 1e12
    return {
        "ok": dt > 0,
        "model": spec.name,
        "dtype": dtype,
        "params": params,
        "tokens_per_step": tokens,
        "seconds_per_step": dt,
        "tflops": achieved,
        "peak_tflops": peak_tflops,
        "mfu": achieved / peak_tflops,
    }


def check_moe(state, tmp: Path, tol: float = FP32_TOL) -> dict:
    """Qwen3-MoE on this device at EP1: log-probs against transformers, then one update that moves the
    router and the routed experts. On GPU this is the `alltoall` dispatcher (and transformer-engine's
    layer spec when it imports); on CPU the `allgather` one (models/megatron.py token_dispatcher)."""
    from dataclasses import replace as _replace

    from megatron_rl.models.megatron import token_dispatcher
    from megatron_rl.models.tiny import write_hf_checkpoint
    from megatron_rl.trainer.hf_import import load_hf_into

    spec = _replace(TINY, name="tiny_moe", family="qwen3_moe", qkv_bias=False, qk_norm=True,
                    num_experts=4, moe_ffn_hidden_size=128, moe_topk=2)  # fmt: skip
    ckpt = write_hf_checkpoint(spec, tmp / "tiny_moe", seed=1)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, spec.vocab_size, (n,), generator=g).tolist() for n in (21, 40)]
    plens = [4, 9]
    ref = _hf_logprobs(ckpt, seqs, plens)
    pol = _policy(spec, state, "fp32", optim=True)
    load_hf_into(pol.model, spec, ckpt, 1, 0, pol.padded_vocab)
    got = pol.logprobs(seqs, plens)
    diff = max((a.cpu() - b).abs().max().item() for a, b in zip(got, ref))
    router = pol.model.decoder.layers[0].mlp.router.weight
    before = router.detach().clone()
    pol.train_step(seqs, plens, lambda lp, mb: (-(lp * mb.loss_mask_BT).sum() / mb.loss_mask_BT.sum(), {}))
    moved = (router.detach() - before).abs().max().item()
    dispatcher = token_dispatcher(on_cpu=state.device.type == "cpu")
    return {
        "ok": diff <= tol and moved > 0,
        "max_abs_diff_vs_hf": diff,
        "fp32_tolerance": tol,
        "router_moved": moved,
        "dispatcher": dispatcher,
    }


def _run(report: dict, name: str, fn, *args):
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except Exception as e:  # report it and go on: the lent minutes should show every failure at once
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    report[name] = {k: v for k, v in out.items() if k not in ("policy", "reference")}
    return out


def default_out() -> Path:
    """Where the report goes without --out: outputs/ of the repository (ignored by git), one per run."""
    return REPO / "outputs" / f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}.json"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--out", type=Path, default=None, help="the JSON report (default: outputs/gpu_check-<time>.json)"
    )
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
    p.add_argument("--skip-mfu", action="store_true")
    args = p.parse_args(argv)
    args.out = args.out or default_out()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    settings = strict_fp32()  # before CUDA starts: cuBLAS and torch read some of it once
    on_gpu = torch.cuda.is_available()
    if (args.device == "cuda") != on_gpu:
        have = "a CUDA device" if on_gpu else "no CUDA device"
        print(f"gpu_check: --device {args.device} but this machine has {have}", file=sys.stderr)
        return 2
    from megatron_rl.telemetry.phases import PhaseTimer

    state = _init()
    timer = PhaseTimer()
    report: dict = {"device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "timer_cuda": timer.cuda}
    precision = _run(report, "precision", check_precision, state, settings)
    tol = precision.get("fp32_tolerance", FP32_TOL)
    with tempfile.TemporaryDirectory() as tmp:
        _run(report, "hf", check_hf, state, Path(tmp), on_gpu, tol)
        trained = _run(report, "train", check_train, state, timer)
        _run(report, "preempt", check_preempt, state)
        _run(report, "moe", check_moe, state, Path(tmp), tol)
        if "policy" in trained:
            _run(report, "publish", check_publish, trained["policy"], TINY)
            _run(report, "ckpt", check_ckpt, trained["policy"], trained["reference"], Path(tmp))
        if not args.skip_mfu:
            spec, seq, mbs, iters = (ONE_B, 2048, 4, 5) if on_gpu else (TINY, 128, 2, 2)
            _run(report, "mfu", check_mfu, state, spec, args.peak_tflops, seq, mbs, iters, timer)
    phases = timer.take()
    report["telemetry"] = {
        "ok": bool(phases) and (not on_gpu or all(s.mem_gib > 0 for s in phases.values())),
        "phases": {k: {"seconds": v.seconds, "allocated_gib": v.mem_gib} for k, v in phases.items()},
    }
    report["ok"] = all(v.get("ok", False) for v in report.values() if isinstance(v, dict) and "ok" in v)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))
    print(f"gpu_check: report written to {args.out}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
