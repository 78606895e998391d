"""torchrun worker (4 processes): every reshard case of cases.py, then fault injection, in one launch.

  torchrun --nproc-per-node 4 worker.py OUT_DIR CKPT_ROOT

Per trainer layout, megatron-core's groups are re-created and a Policy is loaded from the HF
checkpoint (separated cases use order tp-cp-ep-pp-dp so that ranks 0..T-1 hold one whole replica,
which is what ParallelLayout's separated trainer is). Per case, three publications: the loaded
weights, the weights doubled, the loaded weights again. Each rank writes its records to
OUT_DIR/rank{R}.json; the test asserts on them.
"""

import json
import sys
import traceback
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.convert import bytes_equal, engine_layouts, to_hf
from megatron_rl.reshard.plan import Links
from megatron_rl.reshard.publish import InMemorySink, Publisher
from megatron_rl.trainer.hf_import import load_hf_into
from megatron_rl.trainer.parallel import init_parallel, launched_world
from megatron_rl.trainer.policy import Policy
from tests.dist.reshard.cases import (
    BUCKET_BYTES,
    GPUS_PER_NODE,
    SCALE,
    SPECS,
    Case,
    all_cases,
    batch,
    cases_for,
    placements,
    trainer_layouts,
)
from tests.unit.reshard.oracle import expected_engine_tensors

OUT, CKPTS = Path(sys.argv[1]), Path(sys.argv[2])
LINKS = Links(gpus_per_node=GPUS_PER_NODE)


def reinit(tp: int, pp: int, order: str, ep: int = 1, etp: int = 1):
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        order=order,
    )
    layout = ParallelLayout.over(launched_world(), tp, pp, order=order, ep=ep, etp=etp)
    return init_parallel(layout)  # groups exist: only reads them back


def hf_logprobs(spec, state, seqs, prompt_lens):
    from megatron_rl.models.tiny import hf_config, hf_model

    if spec.is_moe:  # HF fuses each layer's experts in memory: let it load the per-expert tensors itself
        import tempfile

        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM

        with tempfile.TemporaryDirectory() as d:
            save_file(
                {k: v.contiguous() for k, v in state.items()},
                f"{d}/model.safetensors",
                metadata={"format": "pt"},
            )
            hf_config(spec).save_pretrained(d)
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    else:
        model = hf_model(spec)
        missing, unexpected = model.load_state_dict(state, strict=False)
        allowed = {"lm_head.weight"} if spec.tie_word_embeddings else set()
        assert not unexpected and set(missing) <= allowed, (missing, unexpected)
    out = []
    for s, p in zip(seqs, prompt_lens):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([s])).logits[0].float(), -1)
        out.append(lp[torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:])])
    return out


def mismatches(got, want, scale=1.0):
    bad = [
        n
        for n in want
        if n not in got or not bytes_equal(got[n], want[n] * scale if scale != 1.0 else want[n])
    ]
    return bad + sorted(set(got) - set(want))


def byte_record(pub, result, rank):
    plan = pub.plan.rank_bytes().get(rank, {})
    s = result.stats
    moved = {
        "sent_intra": s.sent["intra"],
        "sent_inter": s.sent["inter"],
        "recv_intra": s.recv["intra"],
        "recv_inter": s.recv["inter"],
        "local": s.local,
    }
    return {k: plan.get(k, 0) for k in moved}, moved


def run_case(case: Case, spec, hf, params, ref_lp, seqs, prompt_lens) -> dict:
    rank = dist.get_rank()
    layout = ParallelLayout(
        tp=case.tp,
        pp=case.pp,
        dp=case.dp,
        ep=case.ep,
        etp=case.etp,
        engine_tp=case.engine_tp,
        engine_count=case.engine_count,
        placement="colocated" if case.colocated else "separated",
    )
    coord = layout.engine_coord(rank)
    sink = InMemorySink() if coord is not None else None
    # Half the cases send large contiguous pieces as their own messages (no pack buffer). The choice
    # must agree on every rank (str hash() is salted per process; crc32 is not).
    direct = 0 if zlib.crc32(case.key.encode()) % 2 else 1 << 30
    pub = Publisher(
        layout, spec, sink, case.delivery, BUCKET_BYTES, LINKS, torch.float32, direct_min_bytes=direct
    )
    mine = params if layout.is_trainer(rank) else {}
    rec: dict = {
        "case": case.key,
        "rank": rank,
        "engine": None if coord is None else [coord.engine, coord.tp],
    }

    r1 = pub.publish(mine.items(), step=1)
    rec["activated"] = [r1.activated]
    rec["problems"] = r1.problems
    rec["bytes_plan"], rec["bytes_moved"] = byte_record(pub, r1, rank)
    rec["peak_extra"], rec["extra_bound"] = (
        r1.stats.peak_extra_bytes,
        BUCKET_BYTES + pub.plan.largest_tensor_bytes(),
    )
    want = expected_engine_tensors(spec, hf, case.delivery, case.engine_tp, coord.tp) if coord else {}
    rec["mismatch"] = mismatches(sink.tensors(), want) if coord else []

    # A model built from each engine's tensors gives the trainer's log-probs.
    mine_engine = (coord.engine, coord.tp, dict(sink.tensors())) if coord else None
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine_engine)
    if rank == 0:
        diffs = []
        for e in range(case.engine_count):
            parts = sorted((t, ts) for x in every if x is not None and x[0] == e for t, ts in [(x[1], x[2])])
            lays = [engine_layouts(spec, case.delivery, case.engine_tp, t) for t, _ in parts]
            state = to_hf(spec, lays, [ts for _, ts in parts])
            lp = hf_logprobs(spec, state, seqs, prompt_lens)
            diffs.append(max((a - b).abs().max().item() for a, b in zip(lp, ref_lp)))
        rec["logprob_maxdiff"] = max(diffs)

    # Second publication, every weight doubled: the engines follow exactly.
    with torch.no_grad():
        for t in mine.values():
            t.mul_(SCALE)
    r2 = pub.publish(mine.items(), step=2)
    with torch.no_grad():
        for t in mine.values():
            t.div_(SCALE)
    rec["activated"].append(r2.activated)
    rec["mismatch_scaled"] = mismatches(sink.tensors(), want, SCALE) if coord else []
    # Third: the loaded weights again -> the first manifest, entry for entry.
    r3 = pub.publish(mine.items(), step=1)
    rec["activated"].append(r3.activated)
    rec["versions"] = [r1.version, r2.version, r3.version, sink.active_version if sink else None]
    if coord:
        rec["manifest_repeat_equal"] = r3.manifest.entries == r1.manifest.entries
        rec["manifest_scaled_differs"] = not r2.manifest.same_weights(r1.manifest)
    return rec


# The tensor each fault case cuts a column from: a dense MLP's, or one expert's slice of vLLM's fused MoE.
WRONG_SHAPE = {False: "model.layers.1.mlp.down_proj.weight", True: "model.layers.1.mlp.experts.routed_experts.w2_weight[3]"}


def faults(spec, params, layout: ParallelLayout, tag: str) -> list[dict]:
    """Each fault rejects the staged version everywhere; the active one serves on, unchanged."""
    rank = dist.get_rank()
    coord = layout.engine_coord(rank)

    class FaultySink(InMemorySink):
        damage = None

        def stage(self, version, tensors):
            if self.damage is not None:
                self.damage(tensors)
            super().stage(version, tensors)

    sink = FaultySink() if coord else None
    pub = Publisher(layout, spec, sink, "inplace", BUCKET_BYTES, LINKS, torch.float32)
    mine = params if layout.is_trainer(rank) else {}
    clean = pub.publish(mine.items(), step=7)
    served = {n: t.clone() for n, t in sink.tensors().items()} if sink else {}
    manifest = pub.active_manifest.to_dict() if coord else None
    engine_ranks = sorted(r for e in range(layout.engine_count) for r in layout.engine_ranks(e))
    victim_a, victim_b = engine_ranks[0], engine_ranks[-1]

    def flip_first_payload(src, buf):
        if not getattr(flip_first_payload, "done", False):
            buf.view(torch.uint8)[buf.numel() // 2] ^= 0x40
            flip_first_payload.done = True

    wrong_shape = WRONG_SHAPE[spec.is_moe]
    plans = {
        "dropped_tensor": (victim_a, lambda ts: ts.pop("model.layers.0.self_attn.qkv_proj.weight"), None),
        "flipped_byte_in_transit": (victim_b, None, flip_first_payload),
        "wrong_shape": (victim_b, lambda ts: ts.__setitem__(wrong_shape, ts[wrong_shape][:, :-1]), None),
    }
    out = []
    with torch.no_grad():
        for t in mine.values():  # N+1 differs from N, so "unchanged" means something (x2: exact to undo)
            t.mul_(SCALE)
    for name, (victim, damage, hook) in plans.items():
        if sink is not None:
            sink.damage = damage if rank == victim else None
        r = pub.publish(mine.items(), step=8, recv_hook=hook if rank == victim else None)
        rec = {
            "case": f"fault_{tag}_{name}",
            "rank": rank,
            "activated": r.activated,
            "problems": r.problems,
            "victim": victim,
            "active_version": sink.active_version if sink else None,
        }
        if sink is not None:
            rec["unchanged"] = mismatches(sink.tensors(), served) == []
            rec["manifest_unchanged"] = pub.active_manifest.to_dict() == manifest
            rec["staged_left"] = len(sink._staged)
        out.append(rec)
    if sink is not None:
        sink.damage = None
    with torch.no_grad():
        for t in mine.values():
            t.div_(SCALE)
    again = pub.publish(mine.items(), step=7)
    out.append(
        {
            "case": f"fault_{tag}_recovered",
            "rank": rank,
            "activated": again.activated,
            "versions": [clean.version, again.version],
            "same_manifest": (again.manifest.entries == clean.manifest.entries) if coord else None,
        }
    )
    return out


def main() -> None:
    init_parallel(ParallelLayout.over(launched_world(), 1, 1))
    rank = dist.get_rank()
    seqs, prompt_lens = batch()
    records: list[dict] = []
    expected = {c.key for c in all_cases()}
    try:
        for spec_name, spec in SPECS.items():
            hf = load_file(str(CKPTS / spec_name / "model.safetensors"))
            ref_lp = {}
            for tp, pp, ep, etp in trainer_layouts(spec_name):
                for colocated in placements(spec_name):
                    cases = cases_for(spec_name, tp, pp, colocated, ep, etp)
                    if not cases:
                        continue
                    st = reinit(tp, pp, "tp-cp-ep-dp-pp" if colocated else "tp-cp-ep-pp-dp", ep, etp)
                    pol = Policy(spec, st)
                    load_hf_into(
                        pol.model,
                        spec,
                        CKPTS / spec_name,
                        tp,
                        st.tp_rank,
                        pol.padded_vocab,
                        etp,
                        st.expert_coord.etp,
                    )
                    if colocated:  # the trainer's own log-probs at this layout (same weights when separated)
                        ref_lp[(tp, pp)] = pol.logprobs(seqs, prompt_lens)
                    params = {n: p for n, p in pol.named_parameters_global()}
                    for case in cases:
                        records.append(run_case(case, spec, hf, params, ref_lp[(tp, pp)], seqs, prompt_lens))
                        expected.discard(case.key)
                    if spec_name == "qwen2_mha" and (tp, pp, colocated) in ((2, 1, False), (1, 2, True)):
                        lay = ParallelLayout(
                            tp=tp,
                            pp=pp,
                            dp=cases[0].dp,
                            engine_tp=2,
                            engine_count=1 if not colocated else 2,
                            placement="colocated" if colocated else "separated",
                        )
                        records += faults(spec, params, lay, "sep" if not colocated else "pp")
                    if spec.is_moe and (tp, pp, ep, etp) == (1, 1, 2, 2):  # experts split over EP and ETP
                        lay = ParallelLayout(tp=1, dp=4, ep=2, etp=2, engine_tp=2, engine_count=2)
                        records += faults(spec, params, lay, "moe")
        records.append({"case": "coverage", "rank": rank, "missing": sorted(expected)})
    except Exception:
        records.append({"case": "error", "rank": rank, "traceback": traceback.format_exc()})
        (OUT / f"rank{rank}.json").write_text(json.dumps(records, indent=1))
        raise
    (OUT / f"rank{rank}.json").write_text(json.dumps(records, indent=1))
    dist.barrier()


if __name__ == "__main__":
    main()
