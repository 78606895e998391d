"""Trainer checks across layouts (one 4-process torchrun shared by all, ~1 min on 2 cores).

Oracles are independent of megatron-core: HF transformers' own model built from the same random
checkpoint (log-probs), and torch.optim.AdamW on that HF model (one optimizer step).
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_rl.models.hf import megatron_full_to_hf
from megatron_rl.models.tiny import write_hf_checkpoint
from tests.dist.trainer.cases import LOGPROB_CASES, OPTIM, TEMPERATURE, TRAIN_CASES, advantages, batch
from tests.helpers.launch import torchrun
from tests.helpers.specs import QWEN2_TINY, SPECS

pytestmark = pytest.mark.slow
WORKER = "tests/dist/trainer/worker_foundation.py"


def _malformed(src, root):
    """Three broken copies of a good checkpoint: missing tensor, wrong shape, wrong dtype."""
    import shutil

    tensors = load_file(src / "model.safetensors")
    victim = "model.layers.1.mlp.up_proj.weight"
    cases = {
        "bad_missing": {k: v for k, v in tensors.items() if k != victim},
        "bad_shape": {**tensors, victim: tensors[victim][:-1].contiguous()},
        "bad_dtype": {**tensors, victim: tensors[victim].to(torch.float16)},
    }
    for name, t in cases.items():
        d = root / name
        d.mkdir()
        shutil.copy(src / "config.json", d / "config.json")
        save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return victim


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ckpts = tmp_path_factory.mktemp("ckpts")
    out = tmp_path_factory.mktemp("out")
    for i, spec in enumerate(SPECS.values()):
        write_hf_checkpoint(spec, ckpts / spec.name, seed=i)
    victim = _malformed(ckpts / QWEN2_TINY.name, ckpts)
    # Under the device guard: tensors made without a device, host tensors on device groups and big
    # objects over device groups fail here as they would on a GPU (trainer/device_guard.py).
    torchrun(WORKER, 4, [str(out), str(ckpts)], timeout=900, env={"MEGATRON_RL_DEVICE_GUARD": "1"})
    return out, ckpts, victim


def _hf(ckpt):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


def _hf_logprobs(model, seqs, prompt_lens, temperature):
    out = []
    for s, p in zip(seqs, prompt_lens):
        with torch.no_grad():
            logits = model(torch.tensor([s])).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)
        out.append(lp[torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:])])
    return out


@pytest.mark.parametrize("case", LOGPROB_CASES, ids=lambda c: f"{c[0]}-tp{c[1]}pp{c[2]}mbs{c[3]}")
def test_logprobs_match_hf_and_each_other(run, case):
    out, ckpts, _ = run
    spec_name, tp, pp, mbs = case
    seqs, prompt_lens = batch()
    got = torch.load(out / f"logprobs_{spec_name}_tp{tp}pp{pp}mbs{mbs}.pt")
    ref = _hf_logprobs(_hf(ckpts / spec_name), seqs, prompt_lens, TEMPERATURE)
    assert [g.shape for g in got] == [r.shape for r in ref]
    err_hf = max((g - r).abs().max().item() for g, r in zip(got, ref))
    print(f"{case}: max |logp - HF| = {err_hf:.2e}")
    assert err_hf <= 1e-5, f"{case}: max |logp - HF| = {err_hf:.2e}"
    base_file = out / f"logprobs_{spec_name}_tp1pp1mbs1.pt"
    base = torch.load(base_file) if base_file.exists() else None
    if base is not None:
        err_tp1 = max((g - b).abs().max().item() for g, b in zip(got, base))
        assert err_tp1 <= 1e-5, f"{case}: max |logp - TP1| = {err_tp1:.2e}"


def _adamw_reference(ckpt, seqs, prompt_lens):
    """One torch AdamW step on the HF model with the same loss, global-norm clipping, no weight decay."""
    model = _hf(ckpt)
    lps = []
    for s, p in zip(seqs, prompt_lens):
        logits = model(torch.tensor([s])).logits[0].float() / 1.0
        lp = torch.log_softmax(logits, -1)
        lps.append(lp[torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:])])
    adv = advantages(seqs, prompt_lens)
    tokens = sum(len(s) - p for s, p in zip(seqs, prompt_lens))
    loss = -sum((lp * a).sum() for lp, a in zip(lps, adv)) / tokens
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["clip_grad"])
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=OPTIM["lr"],
        betas=(OPTIM["adam_beta1"], OPTIM["adam_beta2"]),
        eps=OPTIM["adam_eps"],
        weight_decay=0.0,
    )
    opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}, float(gnorm)


@pytest.mark.parametrize("layout", TRAIN_CASES, ids=lambda c: f"tp{c[0]}pp{c[1]}")
def test_one_optimizer_step_equals_adamw_reference(run, layout):
    out, ckpts, _ = run
    tp, pp = layout
    seqs, prompt_lens = batch()
    ref, ref_gnorm = _adamw_reference(ckpts / QWEN2_TINY.name, seqs, prompt_lens)
    before = load_file(ckpts / QWEN2_TINY.name / "model.safetensors")
    full = torch.load(out / f"params_tp{tp}pp{pp}.pt")
    got = {}
    for name, t in full.items():
        got.update(megatron_full_to_hf(QWEN2_TINY, name, t))
    assert set(got) == set(ref)
    err = max((got[n] - ref[n]).abs().max().item() for n in ref)
    moved = max((ref[n] - before[n]).abs().max().item() for n in ref)
    metrics = json.loads((out / f"metrics_tp{tp}pp{pp}.json").read_text())
    print(
        f"tp{tp}pp{pp}: max |param - AdamW| = {err:.2e}, step moved params by up to {moved:.2e}, "
        f"grad norm {metrics['grad_norm']:.6f} vs {ref_gnorm:.6f}"
    )
    assert moved > 1e-3, "the reference step must move the weights for the check to mean anything"
    assert err <= 1e-5, f"max |param - AdamW reference| = {err:.2e} (step moved params by up to {moved:.2e})"
    assert metrics["grad_norm"] == pytest.approx(ref_gnorm, rel=1e-4)


@pytest.mark.parametrize("layout", TRAIN_CASES, ids=lambda c: f"tp{c[0]}pp{c[1]}")
def test_the_update_returns_its_own_forward_from_before_the_step(run, layout):
    """`train_step(return_logprobs=True)` gives the log-probs of the weights it started from (what
    algorithm.old_logprobs=auto uses as the old policy and checks against the engine), in the caller's
    order, on every stage: equal to a separate pass before the step, and not to one after it."""
    out, _, _ = run
    tp, pp = layout
    got = torch.load(out / f"forward_tp{tp}pp{pp}.pt")
    before, forward, after = got["before"], got["forward"], got["after"]
    assert [t.shape for t in forward] == [t.shape for t in before]
    same = max((f - b).abs().max().item() for f, b in zip(forward, before))
    moved = max((a - b).abs().max().item() for a, b in zip(after, before))
    assert same <= 1e-6, f"the update's forward differs from the weights it started from by {same:.2e}"
    assert moved > 1e-3, f"the step moved the log-probs by only {moved:.2e}: the check would mean nothing"


def test_malformed_checkpoints_refused_naming_the_tensor(run):
    out, _, victim = run
    results = json.loads((out / "malformed.json").read_text())
    assert set(results) == {"bad_missing", "bad_shape", "bad_dtype"}
    for name, r in results.items():
        assert r["error"] is not None, f"{name} was accepted"
        assert victim in r["error"], f"{name}: error does not name the tensor: {r['error']}"
        assert r["unchanged"], f"{name}: the model was half-loaded"
    assert "missing" in results["bad_missing"]["error"]
    assert "shape" in results["bad_shape"]["error"]
    assert "dtype" in results["bad_dtype"]["error"]
