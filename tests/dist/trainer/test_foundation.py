"""Trainer checks across layouts (one 4-process torchrun shared by all, ~1 min on 2 cores).

Oracles are independent of megatron-core: HF transformers' own model built from the same random
checkpoint (log-probs; a value model's scores and values from a *ForSequenceClassification one), and
torch.optim.AdamW on that HF model (one optimizer step).
"""

import functools
import json
import shutil
import tempfile

import pytest
import torch
from safetensors.torch import load_file, save_file

from megatron_rl.models.hf import SCORE, VALUE_HEAD, megatron_full_to_hf
from megatron_rl.models.tiny import REWARD_PAD_TOKEN_ID, write_hf_checkpoint, write_hf_reward_model
from megatron_rl.trainer.value import HEAD_PARAM
from tests.dist.trainer.cases import (
    LOGPROB_CASES,
    MOE_LOGPROB_CASES,
    MOE_TRAIN_CASES,
    OPTIM,
    OWN_VALUE_CASES,
    TEMPERATURE,
    TRAIN_CASES,
    VALUE_CASES,
    VALUE_TRAIN_CASES,
    VALUE_TRAIN_SPEC,
    advantages,
    batch,
    moe_case_name,
    reward_checkpoint,
    value_case_name,
    value_targets,
)
from tests.helpers.launch import torchrun
from tests.helpers.specs import QWEN2_TINY, QWEN3_MOE_TINY, SPECS

pytestmark = pytest.mark.slow
WORKER = "tests/dist/trainer/worker_foundation.py"


def _malformed(src, root):
    """Three broken copies of a good checkpoint: missing tensor, wrong shape, wrong dtype."""
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


def _without_score(src, dst):
    """A reward checkpoint whose score head is missing (a causal LM's body alone)."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if k != SCORE}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    ckpts = tmp_path_factory.mktemp("ckpts")
    out = tmp_path_factory.mktemp("out")
    for i, spec in enumerate([*SPECS.values(), QWEN3_MOE_TINY]):
        write_hf_checkpoint(spec, ckpts / spec.name, seed=i)
    victim = _malformed(ckpts / QWEN2_TINY.name, ckpts)
    for i, name in enumerate(sorted({c[0] for c in VALUE_CASES})):
        write_hf_reward_model(SPECS[name], ckpts / reward_checkpoint(name), seed=100 + i)
    _without_score(ckpts / reward_checkpoint(VALUE_TRAIN_SPEC), ckpts / "reward_bad_missing_score")
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


@pytest.mark.parametrize("case", MOE_LOGPROB_CASES, ids=lambda c: moe_case_name(*c))
def test_moe_logprobs_match_hf_at_every_expert_layout(run, case):
    """Qwen3-MoE at EP 1/2/4, ETP 1/2, with TP and PP: transformers' own model is the oracle (its
    router and experts are HF's code, not ours), and every layout agrees with EP1."""
    out, ckpts, _ = run
    seqs, prompt_lens = batch()
    got = torch.load(out / f"logprobs_moe_{moe_case_name(*case)}.pt")
    ref = _hf_logprobs(_hf(ckpts / QWEN3_MOE_TINY.name), seqs, prompt_lens, TEMPERATURE)
    err_hf = max((g - r).abs().max().item() for g, r in zip(got, ref))
    base = torch.load(out / f"logprobs_moe_{moe_case_name(1, 1, 1, 1)}.pt")
    err_ep1 = max((g - b).abs().max().item() for g, b in zip(got, base))
    print(f"moe {case}: max |logp - HF| = {err_hf:.2e}, max |logp - EP1| = {err_ep1:.2e}")
    assert err_hf <= 1e-4, f"{case}: max |logp - HF| = {err_hf:.2e}"
    assert err_ep1 <= 1e-5, f"{case}: max |logp - EP1| = {err_ep1:.2e}"


@pytest.mark.parametrize("case", MOE_LOGPROB_CASES, ids=lambda c: moe_case_name(*c))
def test_moe_export_gathers_every_expert_byte_exact(run, case):
    """The HF export's gather at each expert layout gives back the checkpoint it loaded, bit for bit:
    every expert from its EP rank, every ETP shard in place."""
    out, ckpts, _ = run
    full = torch.load(out / f"export_moe_{moe_case_name(*case)}.pt")
    got = {}
    for name, t in full.items():
        got.update(megatron_full_to_hf(QWEN3_MOE_TINY, name, t))
    want = load_file(ckpts / QWEN3_MOE_TINY.name / "model.safetensors")
    assert set(got) == set(want)
    bad = [n for n in want if not torch.equal(got[n], want[n])]
    assert not bad, f"{case}: exported tensors differ from the checkpoint: {bad[:4]}"


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
    return _adamw_step(model, loss)


def _adamw_step(model, loss):
    """Backward of `loss`, global-norm clipping and one torch AdamW step with the trainer's OPTIM; returns
    the tensors under their names on disk, by HF's own saving (in memory an MoE's experts are fused per
    layer, gate_up_proj [E, 2I, H]; on disk they are one tensor per expert and projection), the norm and the
    loss (the whole batch's)."""
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
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        return load_file(f"{d}/model.safetensors"), float(gnorm), float(loss.detach())


TRAINED = [(QWEN2_TINY, f"tp{tp}pp{pp}") for tp, pp in TRAIN_CASES]
TRAINED += [(QWEN3_MOE_TINY, "moe_" + moe_case_name(*c)) for c in MOE_TRAIN_CASES]


@pytest.mark.parametrize("trained", TRAINED, ids=lambda c: c[1])
def test_one_optimizer_step_equals_adamw_reference(run, trained):
    """One distributed-optimizer step (dense at TP/PP/DP; Qwen3-MoE at EP2, and EP2 x TP2 with
    sequence parallelism) equals torch AdamW on the HF model."""
    out, ckpts, _ = run
    spec, tag = trained
    seqs, prompt_lens = batch()
    ref, ref_gnorm, ref_loss = _adamw_reference(ckpts / spec.name, seqs, prompt_lens)
    before = load_file(ckpts / spec.name / "model.safetensors")
    full = torch.load(out / f"params_{tag}.pt")
    got = {}
    for name, t in full.items():
        got.update(megatron_full_to_hf(spec, name, t))
    assert set(got) == set(ref)
    err = max((got[n] - ref[n]).abs().max().item() for n in ref)
    moved = max((ref[n] - before[n]).abs().max().item() for n in ref)
    metrics = json.loads((out / f"metrics_{tag}.json").read_text())
    print(
        f"{tag}: max |param - AdamW| = {err:.2e}, step moved params by up to {moved:.2e}, "
        f"grad norm {metrics['grad_norm']:.6f} vs {ref_gnorm:.6f}"
    )
    assert moved > 1e-3, "the reference step must move the weights for the check to mean anything"
    assert err <= 1e-5, f"max |param - AdamW reference| = {err:.2e} (step moved params by up to {moved:.2e})"
    assert metrics["grad_norm"] == pytest.approx(ref_gnorm, rel=1e-4)
    # rank 0 wrote them: the whole batch's loss, every DP share's part added, on the first stage with PP2 too
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-5), (metrics.get("loss"), ref_loss)


@pytest.mark.parametrize("trained", TRAINED, ids=lambda c: c[1])
def test_the_update_returns_its_own_forward_from_before_the_step(run, trained):
    """`train_step(return_logprobs=True)` gives the log-probs of the weights it started from (what
    algorithm.old_logprobs=auto uses as the old policy and checks against the engine), in the caller's
    order, on every stage: equal to a separate pass before the step, and not to one after it."""
    out, _, _ = run
    got = torch.load(out / f"forward_{trained[1]}.pt")
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


# ---- value models (trainer/value.py) ---------------------------------------------------------


def _hf_reward(ckpt):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(ckpt, dtype=torch.float32).eval()


def _hf_values(model, seq):
    """transformers' per-position values: its score head on the body's last hidden state [S]."""
    return model.score(model.model(torch.tensor([seq])).last_hidden_state)[0, :, 0]


@functools.cache
def _hf_reward_outputs(ckpt):
    """transformers' own scores (its pooled logits) and per-completion-token values (the value of the
    state before each completion token: positions p-1 .. n-2), fp32."""
    model = _hf_reward(ckpt)
    seqs, prompt_lens = batch()
    # transformers scores the last token that is not the padding id: the batch must not contain it.
    assert all(REWARD_PAD_TOKEN_ID not in s for s in seqs)
    scores, values = [], []
    with torch.no_grad():
        for s, p in zip(seqs, prompt_lens):
            score = model(torch.tensor([s])).logits[0, 0].float()
            per_position = _hf_values(model, s)
            assert torch.allclose(per_position[-1], score, atol=1e-6), "the oracle's two paths disagree"
            scores.append(float(score))
            values.append(per_position[p - 1 : len(s) - 1].clone())
    return scores, values


def _value_case_id(case) -> str:
    return value_case_name(*case)


# Each value case at megatron-core's global groups, and the own-layout cases (trainer/model_groups.py) as
# 5-tuples ending in own=True: both against the same references.
ALL_VALUE_CASES = VALUE_CASES + [(*c, True) for c in OWN_VALUE_CASES]
ALL_VALUE_TRAIN_CASES = VALUE_TRAIN_CASES + [
    (tp, pp, sp, True) for _, tp, pp, sp in OWN_VALUE_CASES if (tp, pp, sp) in VALUE_TRAIN_CASES
]


@pytest.mark.parametrize("case", ALL_VALUE_CASES, ids=_value_case_id)
def test_reward_model_scores_and_values_match_transformers(run, case):
    """A value model loaded from a one-label *ForSequenceClassification checkpoint: its scores equal
    transformers' on the same tokens, and its per-token values transformers' score(hidden) at each
    position, within 1e-4 in fp32, at every layout (on the first stage, which received them with PP2);
    and every layout agrees with TP1 x PP1."""
    out, ckpts, _ = run
    spec_name = case[0]
    seqs, prompt_lens = batch()
    got = torch.load(out / f"value_{_value_case_id(case)}.pt")
    ref_scores, ref_values = _hf_reward_outputs(ckpts / reward_checkpoint(spec_name))
    assert len(got["scores"]) == len(seqs)
    assert [v.shape for v in got["values"]] == [r.shape for r in ref_values]
    err_scores = max(abs(g - r) for g, r in zip(got["scores"], ref_scores))
    err_values = max((g - r).abs().max().item() for g, r in zip(got["values"], ref_values))
    spread = max(ref_scores) - min(ref_scores)
    print(f"{case}: max |score - HF| = {err_scores:.2e}, max |value - HF| = {err_values:.2e}")
    assert spread > 0.1, f"the reference scores barely differ ({spread:.2e}): the check would mean little"
    assert err_scores <= 1e-4, f"{case}: max |score - HF| = {err_scores:.2e}"
    assert err_values <= 1e-4, f"{case}: max |value - HF| = {err_values:.2e}"
    base = torch.load(out / f"value_{value_case_name(spec_name, 1, 1, False)}.pt")
    err_base = max((g - b).abs().max().item() for g, b in zip(got["values"], base["values"]))
    assert err_base <= 1e-5, f"{case}: max |value - TP1PP1| = {err_base:.2e}"


@functools.cache
def _value_adamw_reference(ckpt):
    """One torch AdamW step on the HF sequence-classification model: squared error of its per-token
    score outputs against the fixed targets over the global token count, global-norm clipping."""
    model = _hf_reward(ckpt)
    seqs, prompt_lens = batch()
    targets = value_targets(seqs, prompt_lens)
    tokens = sum(len(s) - p for s, p in zip(seqs, prompt_lens))
    loss = 0.0
    for s, p, t in zip(seqs, prompt_lens, targets):
        loss = loss + ((_hf_values(model, s)[p - 1 : len(s) - 1] - t) ** 2).sum()
    return _adamw_step(model, loss / tokens)


@pytest.mark.parametrize(
    "trained", ALL_VALUE_TRAIN_CASES, ids=lambda c: value_case_name(VALUE_TRAIN_SPEC, *c)
)
def test_value_step_equals_adamw_reference(run, trained):
    """One value-model optimizer step (TP2 x DP2, the same with sequence parallelism, TP2 x PP2) equals
    torch AdamW on the HF model's per-token scores. With sequence parallelism the head gathers the
    sequence and its backward must keep each rank's slice: summing the TP ranks' identical gradients
    would double the body's and show here (the grad norm first). The head, replicated, stays equal on
    every TP and DP rank."""
    out, ckpts, _ = run
    spec = SPECS[VALUE_TRAIN_SPEC]
    tag = value_case_name(VALUE_TRAIN_SPEC, *trained)
    ckpt = ckpts / reward_checkpoint(VALUE_TRAIN_SPEC)
    ref, ref_gnorm, ref_loss = _value_adamw_reference(ckpt)
    before = load_file(ckpt / "model.safetensors")
    full = torch.load(out / f"value_params_{tag}.pt")
    # The head is read below, rank by rank: the export's gather takes `output_layer.weight` for the
    # vocabulary's rows (TP shards to concatenate), and a value model's is replicated.
    full.pop(HEAD_PARAM, None)
    full.pop(VALUE_HEAD, None)
    got = {}
    for name, t in full.items():
        got.update(megatron_full_to_hf(spec, name, t))
    heads = [torch.load(f) for f in sorted(out.glob(f"value_head_{tag}_rank*.pt"))]
    assert len(heads) == 4 // trained[1], "one head copy per last-stage rank"
    assert all(torch.equal(h, heads[0]) for h in heads), "the head's copies differ between ranks"
    got[SCORE] = heads[0]
    assert set(got) == set(ref)
    err = max((got[n] - ref[n]).abs().max().item() for n in ref)
    err_head = (got[SCORE] - ref[SCORE]).abs().max().item()
    moved = max((ref[n] - before[n]).abs().max().item() for n in ref)
    moved_head = (ref[SCORE] - before[SCORE]).abs().max().item()
    metrics = json.loads((out / f"value_metrics_{tag}.json").read_text())
    print(
        f"{tag}: max |param - AdamW| = {err:.2e} (head {err_head:.2e}), step moved params by up to "
        f"{moved:.2e} (head {moved_head:.2e}), grad norm {metrics['grad_norm']:.6f} vs {ref_gnorm:.6f}"
    )
    assert moved > 1e-3 and moved_head > 1e-3, "the reference step must move the weights, head included"
    assert err <= 1e-5, f"max |param - AdamW reference| = {err:.2e} (step moved params by up to {moved:.2e})"
    assert metrics["grad_norm"] == pytest.approx(ref_gnorm, rel=1e-4)
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-5), (metrics.get("loss"), ref_loss)


def test_reward_model_without_score_refused(run):
    """A reward checkpoint without `score.weight` is refused, naming it, and the model is left as it was."""
    out, _, _ = run
    r = json.loads((out / "value_malformed.json").read_text())
    assert r["error"] is not None, "a reward checkpoint without its score head was accepted"
    assert SCORE in r["error"] and "missing" in r["error"], r["error"]
    assert r["unchanged"], "the model was half-loaded"


def test_job_rank_0_reads_the_problem_set_and_every_rank_gets_it(run):
    """Start-up: one read of data.source per job, not per rank (loop/step/components.py read_problems)."""
    from megatron_rl.data.problems import load_problems

    out, _, _ = run
    every = json.loads((out / "shared_problems.json").read_text())
    want = [p.id for p in load_problems("bundled")]
    assert len(every) == 4 and len(want) > 10
    # ranks 1-3 would have raised had they read the files themselves
    assert all(r["bundled"] == {"ids": want, "types": ["Problem"]} for r in every), every
    missing = [r["missing"]["error"] for r in every]
    assert "no_such_problems.jsonl" in missing[0] and "job rank 0" not in missing[0]
    assert all(m.startswith("RuntimeError:") and "job rank 0 could not read it" in m for m in missing[1:])
    assert all("no_such_problems.jsonl" in m for m in missing[1:])
    # an error of a kind the reader is not known to raise still reaches every rank (none hangs)
    unexpected = [r["unexpected"]["error"] for r in every]
    assert unexpected[0] == "KeyError: 'question'"
    assert all(m.startswith("RuntimeError:") and "KeyError" in m for m in unexpected[1:]), unexpected


def test_critic_from_policy_at_another_layout_copies_every_weight(run):
    """critic.init=policy at a layout of its own (trainer/model_groups.py copy_weights): a TP1 policy's
    weights land in a TP2 x PP2 value model exactly, each rank taking its shard of every full tensor; the
    vocabulary rows re-padded for TP2, the value head left at zero."""
    out, _, _ = run
    spec = SPECS[VALUE_TRAIN_SPEC]
    r = torch.load(out / "critic_from_policy.pt")
    source, copy = r["source"], r["copy"]
    body = [n for n in copy if n != HEAD_PARAM]
    assert r["copied"] == sorted(body) and len(body) > 10, "every weight of every stage, once"
    for name in body:
        a, b = source[name], copy[name]
        if a.shape != b.shape:  # vocabulary rows: the same rows, each layout's own padding after them
            n = spec.vocab_size
            assert a.shape[1:] == b.shape[1:] and torch.equal(a[:n], b[:n]), name
            assert not b[n:].any(), f"{name}: padding rows were copied"
        else:
            assert torch.equal(a, b), name
    assert not copy[HEAD_PARAM].any(), "the value head must start at zero"
    # a body of twice the FFN width: every rank refused (none hung in the copy's collective loop), naming
    # a tensor and both shapes
    ffn, h = spec.ffn_hidden_size, spec.hidden_size  # fc1 holds gate and up: 2 x FFN rows over TP2
    for rank, said in enumerate(r["wider"]):
        assert said is not None and said.startswith(f"TP rank {rank % 2} of 2: decoder.layers."), r["wider"]
        assert f"linear_fc1.weight: the source's shard is ({ffn}, {h}), the model's ({2 * ffn}, {h})" in said
        assert f"linear_fc2.weight: the source's shard is ({h}, {ffn // 2}), the model's ({h}, {ffn})" in said


def test_weights_written_after_the_optimizer_survive_its_first_step_in_bf16(run):
    """The policy imported from HF and the critic copied from it (trainer/build.py), both bf16 with their
    optimizer built first: a step with zero gradients moves nothing. The control, a copy whose optimizer was
    not refreshed, moves: its first step restores the initialisation (what the run did before the refresh)."""
    out, _, _ = run
    found = json.loads((out / "bf16_first_step.json").read_text())
    assert found["policy"] == 0.0 and found["critic"] == 0.0, found
    assert found["control"] > 1e-2, found
