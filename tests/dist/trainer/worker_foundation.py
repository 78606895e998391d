"""torchrun worker (4 processes) for the trainer's multi-process checks, sharing one megatron import.

  torchrun --nproc-per-node 4 worker_foundation.py OUT_DIR CKPT_ROOT

For each (family, TP, PP) case: build the trainer from the HF checkpoint CKPT_ROOT/<spec name>,
compute teacher-forced log-probs; then one optimizer step at TP2 (DP2) and TP2xPP2 (DP1); then try
malformed checkpoints. Then the same for value models (trainer/value.py) from the reward checkpoints
CKPT_ROOT/reward_<spec name>: scores and per-token values, one optimizer step, a reward checkpoint without
its score head. Last, the problem set read by job rank 0 and shared (components.read_problems). Rank 0
(and stage leaders) write results into OUT_DIR for the test to check.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.trainer.gather import full_state
from megatron_rl.trainer.hf_import import CheckpointError, load_hf_into
from megatron_rl.trainer.parallel import init_parallel, launched_world
from megatron_rl.trainer.policy import OptimSettings, Policy
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
    reinit,
    reward_checkpoint,
    train_loss,
    value_case_name,
    value_loss,
    value_targets,
)
from tests.helpers.specs import QWEN3_MOE_TINY, SPECS

OUT, CKPTS = Path(sys.argv[1]), Path(sys.argv[2])


def main() -> None:
    st = init_parallel(ParallelLayout.over(launched_world(), 1, 1))
    rank = st.env.rank
    seqs, prompt_lens = batch()
    for spec_name, tp, pp, mbs in LOGPROB_CASES:
        spec = SPECS[spec_name]
        st = reinit(tp, pp)
        pol = Policy(spec, st, micro_batch_size=mbs)
        load_hf_into(pol.model, spec, CKPTS / spec_name, tp, st.tp_rank, pol.padded_vocab)
        lps = pol.logprobs(seqs, prompt_lens, temperature=TEMPERATURE)
        if rank == 0:
            torch.save(lps, OUT / f"logprobs_{spec_name}_tp{tp}pp{pp}mbs{mbs}.pt")

    for tp, pp, ep, etp in MOE_LOGPROB_CASES:  # Qwen3-MoE at every expert layout that fits 4 processes
        spec = QWEN3_MOE_TINY
        st = reinit(tp, pp, ep, etp, sequence_parallel=tp > 1)
        pol = Policy(spec, st)
        load_hf_into(
            pol.model, spec, CKPTS / spec.name, tp, st.tp_rank, pol.padded_vocab, etp, st.expert_coord.etp
        )
        lps = pol.logprobs(seqs, prompt_lens, temperature=TEMPERATURE)
        full = full_state(pol)  # the HF export's gather, experts from every EP x ETP rank
        if rank == 0:
            torch.save(lps, OUT / f"logprobs_moe_{moe_case_name(tp, pp, ep, etp)}.pt")
            torch.save(full, OUT / f"export_moe_{moe_case_name(tp, pp, ep, etp)}.pt")

    train_cases = [(SPECS["qwen2_tiny"], (tp, pp, 1, 1), f"tp{tp}pp{pp}") for tp, pp in TRAIN_CASES]
    train_cases += [(QWEN3_MOE_TINY, c, "moe_" + moe_case_name(*c)) for c in MOE_TRAIN_CASES]
    for spec, (tp, pp, ep, etp), tag in train_cases:
        st = reinit(tp, pp, ep, etp, sequence_parallel=spec.is_moe and tp > 1)
        pol = Policy(spec, st, optim=OptimSettings(**OPTIM))
        load_hf_into(
            pol.model, spec, CKPTS / spec.name, tp, st.tp_rank, pol.padded_vocab, etp, st.expert_coord.etp
        )
        # Each DP rank trains on its contiguous share; the loss is normalised by the global token count.
        n = len(seqs) // st.dp
        mine = slice(st.dp_rank * n, (st.dp_rank + 1) * n)
        global_tokens = float(sum(len(s) - p for s, p in zip(seqs, prompt_lens)))
        adv = advantages(seqs, prompt_lens)[mine]
        before = pol.logprobs(seqs[mine], prompt_lens[mine])
        metrics, forward = pol.train_step(
            seqs[mine],
            prompt_lens[mine],
            train_loss(global_tokens),
            extras={"adv": adv},
            return_logprobs=True,
        )
        after = pol.logprobs(seqs[mine], prompt_lens[mine])
        full = full_state(pol)  # the whole model on rank 0 (the HF export's own gather)
        if rank == 0:
            torch.save(full, OUT / f"params_{tag}.pt")
            # The update's own forward (algorithm.old_logprobs=auto) against separate passes around it.
            torch.save({"before": before, "forward": forward, "after": after}, OUT / f"forward_{tag}.pt")
            # rank 0 writes the run's records: with PP2 it is on the first stage, which computed no loss
            (OUT / f"metrics_{tag}.json").write_text(json.dumps(metrics))

    # Malformed checkpoints: refused, naming the tensor, with the model untouched.
    spec = SPECS["qwen2_tiny"]
    st = reinit(2, 1)
    pol = Policy(spec, st)
    load_hf_into(pol.model, spec, CKPTS / spec.name, 2, st.tp_rank, pol.padded_vocab)
    before = {n: p.detach().clone() for n, p in pol.named_parameters_global()}
    results = {}
    for bad in sorted(p for p in CKPTS.iterdir() if p.name.startswith("bad_")):
        try:
            load_hf_into(pol.model, spec, bad, 2, st.tp_rank, pol.padded_vocab)
            msg = None
        except CheckpointError as e:
            msg = str(e)
        unchanged = all(torch.equal(before[n], p) for n, p in pol.named_parameters_global())
        results[bad.name] = {"error": msg, "unchanged": unchanged}
    if rank == 0:
        (OUT / "malformed.json").write_text(json.dumps(results, indent=1))
    value_models(rank)
    own_layout_value_models(rank)
    bf16_weights_survive_the_first_step(rank)
    shared_problems(rank)
    dist.barrier()


def shared_problems(rank: int) -> None:
    """components.read_problems over the job's gloo group: job rank 0 reads the problem set, the others
    receive it without reading (their reader raises if called); a source rank 0 cannot read fails on
    every rank, none waiting."""
    from types import SimpleNamespace

    from megatron_rl.data import problems as data_problems
    from megatron_rl.loop.step import components

    group = dist.new_group(backend="gloo")
    procs = SimpleNamespace(rank=rank, job_cpu_group=group)
    real = data_problems.load_problems

    def on_rank_0(source, columns=None):  # a reader failing with an error of no expected kind
        if source == "<raises KeyError>":
            raise KeyError("question")
        return real(source, columns)

    def refuse(*_a, **_k):
        raise AssertionError(f"rank {rank} read the problem set itself")

    data_problems.load_problems = on_rank_0 if rank == 0 else refuse
    out = {}
    cases = (
        ("bundled", "bundled"),
        ("missing", str(OUT / "no_such_problems.jsonl")),
        ("unexpected", "<raises KeyError>"),
    )
    for name, source in cases:
        run = SimpleNamespace(recipe=SimpleNamespace(data=SimpleNamespace(source=source, columns=None)))
        try:
            got = components.read_problems(run, procs)
            out[name] = {"ids": [p.id for p in got], "types": sorted({type(p).__name__ for p in got})}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, out, group=group)
    if rank == 0:
        (OUT / "shared_problems.json").write_text(json.dumps(every, indent=1))


def torch_norms_with_sequence_parallelism() -> None:
    """Let the local spec's torch norms run under sequence parallelism, as transformer-engine's do.

    megatron-core's `WrappedTorchNorm` refuses sequence parallelism (the CPU build has no
    transformer-engine), although a norm is per-token and runs on a sequence slice unchanged. What sequence
    parallelism changes is its weight's gradient: each TP rank sees only its slice, so TE's norms mark the
    weight `sequence_parallel` and megatron's `finalize_model_grads` sums it over TP. This builds the same
    torch norm and marks it the same way; nothing else in the model changes. Test-only."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    original = WrappedTorchNorm.__new__

    def new(cls, config, hidden_size, eps=1e-5, **kwargs):
        if not config.sequence_parallel:
            return original(cls, config, hidden_size, eps, **kwargs)
        config.sequence_parallel = False  # past the refusal only; every other check still runs
        try:
            norm = original(cls, config, hidden_size, eps, **kwargs)
        finally:
            config.sequence_parallel = True
        for p in norm.parameters():
            p.sequence_parallel = True
        return norm

    WrappedTorchNorm.__new__ = staticmethod(new)


def value_models(rank: int) -> None:
    """Value models: scores and values at each layout; at the training layouts (built with an optimizer)
    one optimizer step after them; at TP2 also a reward checkpoint without its score head, refused."""
    torch_norms_with_sequence_parallelism()
    seqs, prompt_lens = batch()
    global_tokens = float(sum(len(s) - p for s, p in zip(seqs, prompt_lens)))
    layout = None
    for spec_name, tp, pp, sp in VALUE_CASES:
        if (tp, pp, sp) != layout:  # the cases come grouped by layout: build the groups once per layout
            st, layout = reinit(tp, pp, sequence_parallel=sp), (tp, pp, sp)
        vm = _value_case(rank, st, spec_name, seqs, prompt_lens, global_tokens, own=False)
        if (spec_name, tp, pp, sp) == (VALUE_TRAIN_SPEC, 2, 1, False):
            _refuse_reward_model_without_score(vm, SPECS[spec_name], st, rank)


def own_layout_value_models(rank: int) -> None:
    """The value cases again at layouts of their own (trainer/model_groups.py) under megatron-core's global
    groups at TP1 x DP4; then a policy at TP1 copied into a value model at TP2 x PP2 (critic.init=policy)."""
    from megatron_rl.trainer.model_groups import copy_weights, state_at

    seqs, prompt_lens = batch()
    global_tokens = float(sum(len(s) - p for s, p in zip(seqs, prompt_lens)))
    trainer = reinit(1, 1)
    for spec_name, tp, pp, sp in OWN_VALUE_CASES:
        layout = trainer.layout.with_(
            tp=tp, pp=pp, dp=trainer.layout.trainer_world // (tp * pp), sequence_parallel=sp
        )
        st = state_at(trainer, layout, timeout_s=300)
        _value_case(rank, st, spec_name, seqs, prompt_lens, global_tokens, own=True)
    spec = SPECS[VALUE_TRAIN_SPEC]
    policy = Policy(spec, trainer)
    load_hf_into(policy.model, spec, CKPTS / spec.name, 1, trainer.tp_rank, policy.padded_vocab)
    st = state_at(trainer, trainer.layout.with_(tp=2, pp=2, dp=1), timeout_s=300)
    critic = Policy(spec, st, head="value")
    copied: list = [None] * dist.get_world_size()
    dist.all_gather_object(copied, copy_weights(policy, critic, skip=(HEAD_PARAM,)), group=trainer.cpu_group)
    copied = sorted({n for names in copied for n in names})
    source, copy = full_state(policy), full_state(critic)
    # Into a body of another FFN width: every rank raises, after the collective loop (none is left in it)
    wider = Policy(replace(spec, ffn_hidden_size=2 * spec.ffn_hidden_size), st, head="value")
    try:
        copy_weights(policy, wider, skip=(HEAD_PARAM,))
        refused = None
    except RuntimeError as e:
        refused = str(e)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, refused, group=trainer.cpu_group)
    if rank == 0:
        torch.save(
            {"source": source, "copy": copy, "copied": copied, "wider": every}, OUT / "critic_from_policy.pt"
        )


def bf16_weights_survive_the_first_step(rank: int) -> None:
    """Weights written after the optimizer was built (an HF import, critic.init=policy) in bf16: a step with
    zero gradients must leave them where they are. The optimizer keeps an fp32 main copy taken when it was
    built; without `Policy.weights_written` its first step puts that copy back. Through the run's own
    builders (trainer/build.py): the policy from an HF checkpoint, the critic copied from it at TP1 x DP4;
    and, as the control, the same copy without the refresh."""
    from megatron_rl.config.load import load_recipe
    from megatron_rl.run import resolve
    from megatron_rl.trainer.build import build_critic, build_policy
    from megatron_rl.trainer.model_groups import copy_weights

    spec = replace(SPECS[VALUE_TRAIN_SPEC], params_dtype="bf16")
    run = resolve(load_recipe("ppo_tiny_cpu", ["layout.dp=2", "critic.tp=1", "optim.micro_batch_size=1"]))
    model = replace(run.recipe.model, hf_checkpoint=str(CKPTS / spec.name))
    run = replace(run, spec=spec, critic_spec=spec, recipe=replace(run.recipe, model=model))
    st = reinit(2, 1)
    seqs, prompt_lens = batch()
    zero = lambda out, mb: ((out * 0).sum(), {})  # noqa: E731

    def drift(pol, train) -> float:
        before = {n: p.detach().float().clone() for n, p in pol.named_parameters_global()}
        train(pol)
        return max(float((p.float() - before[n]).abs().max()) for n, p in pol.named_parameters_global())

    policy = build_policy(run, st)
    critic = build_critic(run, st, policy)
    control = Policy(spec, critic.state, head="value", optim=OptimSettings(**OPTIM))
    copy_weights(policy, control, skip=(HEAD_PARAM,))  # no refresh: its main copy is of the initialisation
    mine = [i for i in range(len(seqs)) if i % critic.state.dp == critic.state.dp_rank]
    on_critic = lambda m: m.train_step([seqs[i] for i in mine], [prompt_lens[i] for i in mine], zero)  # noqa: E731
    share = [i for i in range(len(seqs)) if i % st.dp == st.dp_rank]
    on_policy = lambda m: m.train_step([seqs[i] for i in share], [prompt_lens[i] for i in share], zero)  # noqa: E731
    found = {
        "policy": drift(policy, on_policy),
        "critic": drift(critic, on_critic),
        "control": drift(control, on_critic),
    }
    if rank == 0:
        (OUT / "bf16_first_step.json").write_text(json.dumps(found))


def _value_case(rank, st, spec_name, seqs, prompt_lens, global_tokens, own: bool):
    """Scores and values of one value model at `st`'s layout; one optimizer step at the training layouts."""
    tp, pp, sp = st.tp, st.pp, st.layout.sequence_parallel
    spec, tag = SPECS[spec_name], value_case_name(spec_name, tp, pp, sp, own)
    trains = spec_name == VALUE_TRAIN_SPEC and (tp, pp, sp) in VALUE_TRAIN_CASES
    vm = Policy(spec, st, head="value", optim=OptimSettings(**OPTIM) if trains else None)
    ckpt = CKPTS / reward_checkpoint(spec_name)
    load_hf_into(vm.model, spec, ckpt, tp, st.tp_rank, vm.padded_vocab, value_head=True)
    got = {"scores": vm.scores(seqs), "values": vm.values(seqs, prompt_lens)}
    if rank == 0:  # the first stage: with PP2, what the last stage sent it
        torch.save(got, OUT / f"value_{tag}.pt")
    if trains:  # each DP rank its contiguous share, the loss normalised by the global token count
        n = len(seqs) // st.dp
        mine = slice(st.dp_rank * n, (st.dp_rank + 1) * n)
        targets = value_targets(seqs, prompt_lens)[mine]
        metrics = vm.train_step(
            seqs[mine], prompt_lens[mine], value_loss(global_tokens), extras={"target": targets}
        )
        full = full_state(vm)
        if rank == 0:
            torch.save(full, OUT / f"value_params_{tag}.pt")
            (OUT / f"value_metrics_{tag}.json").write_text(json.dumps(metrics))
        # Every last-stage rank's copy of the head: replicated over TP and DP, after the step too.
        head = dict(vm.named_parameters_global()).get(HEAD_PARAM)
        if head is not None:
            torch.save(head.detach().cpu(), OUT / f"value_head_{tag}_rank{rank}.pt")
    return vm


def _refuse_reward_model_without_score(vm, spec, st, rank: int) -> None:
    """A reward checkpoint without `score.weight`: refused, naming it, the model untouched."""
    before = {n: p.detach().clone() for n, p in vm.named_parameters_global()}
    try:
        bad = CKPTS / "reward_bad_missing_score"
        load_hf_into(vm.model, spec, bad, st.tp, st.tp_rank, vm.padded_vocab, value_head=True)
        msg = None
    except CheckpointError as e:
        msg = str(e)
    unchanged = all(torch.equal(before[n], p) for n, p in vm.named_parameters_global())
    if rank == 0:
        (OUT / "value_malformed.json").write_text(json.dumps({"error": msg, "unchanged": unchanged}))


if __name__ == "__main__":
    main()
