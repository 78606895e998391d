"""Before a version serves: a small fixed probe, scored by every engine and by the trainer.

After each publication has passed its manifest (the bytes arrived whole) and before the engines draw a
single sample with it, every engine scores a few fixed token sequences with the version just activated
(a prefill: rollout/scoring.py), and the trainer, holding the very weights it published, scores the same
sequences teacher-forced. Where the two disagree beyond the thresholds of their dtypes
(rollout/agreement.py), the version means another model than the trainer's -- a conversion bug the
checksums cannot see -- and the publication is refused like one whose manifest failed: the engines go back
to the version they served before (reshard/publish.py `Publisher.roll_back`), and the run's refusal policy
decides what follows (loop/placement/publication.py).

The probe: `rollout.logprob_probe_prompts` sequences of `rollout.logprob_probe_tokens` token ids drawn once
from the run's seed over the model's vocabulary (the same every publication, so the figures of two
versions compare; random ids reach every embedding row and, in an MoE, every expert). Each engine is
judged on its own scores: a fault in one engine's slice of the weights is named with its engine.

Collective over the job's gloo group: every rank of the job calls it at the same point (colocated ranks
are engine and trainer; a separated job's engine ranks score and its trainer ranks score). The trainer's
job rank 0 decides and every rank receives the same verdict.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from megatron_rl.rollout.agreement import Thresholds, problems, worst
from megatron_rl.rollout.logprob_check import compare
from megatron_rl.rollout.scoring import prompt_logprobs
from megatron_rl.rollout.types import Sample


@dataclass
class ProbeVerdict:
    version: int
    passed: bool
    problems: list[str]  # "engine E: ..." (empty when passed)
    stats: dict  # the worst engine's figures (rollout/agreement.py `worst`)
    per_engine: dict[int, dict] = field(default_factory=dict)
    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)  # rank 0's engine, gather and trainer seconds

    def record(self, thresholds: Thresholds) -> dict:
        """What the step record keeps of the probe."""
        return {
            "version": self.version,
            "passed": self.passed,
            "max_abs_diff": self.stats.get("max_abs_diff"),
            "mean_abs_diff": self.stats.get("mean_abs_diff"),
            "tokens": self.stats.get("tokens"),
            "engines": len(self.per_engine),
            "max_gap": thresholds.max_gap,
            "mean_gap": thresholds.mean_gap,
            "problems": self.problems[:8],
            "seconds": round(self.seconds, 6),
            **{k: round(v, 6) for k, v in self.parts.items()},
        }


def probe_sequences(vocab_size: int, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` sequences of `length` token ids, the same for every publication of a run."""
    rng = random.Random(f"logprob-probe-{seed}")
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(count)]


class Prober:
    """One per rank. `engine`/`engine_index`/`is_leader`: this rank's part of an engine (None on a separated
    job's trainer rank); `policy`: the trainer (None on a separated job's engine rank)."""

    def __init__(
        self,
        sequences: list[list[int]],
        thresholds: Thresholds,
        cpu_group,
        *,
        engine=None,
        engine_index: int = -1,
        is_leader: bool = False,
        policy=None,
        timer=None,
    ):
        self.sequences, self.thresholds, self.cpu_group = sequences, thresholds, cpu_group
        self.engine, self.engine_index, self.is_leader = engine, engine_index, is_leader
        self.policy, self.timer = policy, timer

    def __call__(self, version: int) -> ProbeVerdict:
        """Probe the version the engines serve now (just activated). Collective over the job."""
        t0 = time.perf_counter()
        if self.timer is not None:
            with self.timer.phase("probe"):
                verdict = self._probe(version)
        else:
            verdict = self._probe(version)
        verdict.seconds = time.perf_counter() - t0
        return verdict

    def _probe(self, version: int) -> ProbeVerdict:
        mine, t0 = None, time.perf_counter()
        if self.engine is not None:  # every rank of an engine, in lockstep
            scores = prompt_logprobs(self.engine, self.sequences, tag=f"probe-v{version}")
            mine = (self.engine_index, scores) if self.is_leader else None
        t1 = time.perf_counter()
        parts: list = [None] * dist.get_world_size(self.cpu_group)
        dist.all_gather_object(parts, mine, group=self.cpu_group)
        by_engine = dict(sorted(p for p in parts if p is not None))
        t2 = time.perf_counter()
        verdict = self._judge(version, by_engine) if self.policy is not None else None
        if verdict is not None:
            verdict.parts = {"engine_s": t1 - t0, "gather_s": t2 - t1, "trainer_s": time.perf_counter() - t2}
        box = [verdict]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)  # job rank 0 is a trainer rank
        return box[0]

    def _judge(self, version: int, by_engine: dict[int, list[list[float]]]) -> ProbeVerdict:
        if not by_engine:
            return ProbeVerdict(version, False, ["no engine returned its probe scores"], {})
        seqs = self.sequences
        # Temperature 1: the engines' prompt log-probs are raw log-softmax in every logprobs_mode.
        trainer = self.policy.logprobs(seqs, [1] * len(seqs), temperature=1.0, micro_batch_size=len(seqs))
        per_engine, found = {}, []
        for e, scores in by_engine.items():
            samples = [_as_sample(i, seq, lp, version) for i, (seq, lp) in enumerate(zip(seqs, scores))]
            stats = compare(samples, trainer, self.thresholds.max_gap, version)
            per_engine[e] = {
                k: stats[k] for k in ("max_abs_diff", "mean_abs_diff", "tokens", "nonfinite_tokens")
            }
            wrong = problems(stats, self.thresholds)
            if wrong:
                found.append(f"engine {e}: " + ", ".join(wrong))
        return ProbeVerdict(version, not found, found, worst(per_engine), per_engine)


def _as_sample(i: int, seq: list[int], logprobs: list[float], version: int) -> Sample:
    """A scored sequence in the form the agreement compares: its first token the prompt, the rest scored."""
    return Sample(i, 0, seq[:1], seq[1:], logprobs, "length", False, version)


def step_problems(agreement: dict, thresholds: Thresholds, group) -> list[str]:
    """The step's agreement over every trainer rank (each compared its own share of the batch): what is
    wrong with it, the same on every rank, and its figures into `agreement["all_ranks"]`. Collective over
    the trainer's gloo `group`.

    Only a batch drawn by the version the trainer held when it scored it is judged (`version_lag` 0): the
    tokens of an older version (asynchronous, or a refused publication) also measure the updates since,
    so there the probe of each publication is the check that acts."""
    import torch

    tokens, nonfinite = int(agreement["tokens"]), int(agreement["nonfinite_tokens"])
    mean = agreement["mean_abs_diff"]
    host = dict(dtype=torch.float64, device="cpu")  # the gloo group's: host tensors, said so
    compared = tokens - nonfinite > 0
    total = torch.tensor([mean * (tokens - nonfinite) if compared else 0.0, tokens, nonfinite], **host)
    biggest = torch.tensor([agreement["max_abs_diff"] if compared else 0.0], **host)
    if dist.is_initialized():
        dist.all_reduce(total, group=group)
        dist.all_reduce(biggest, op=dist.ReduceOp.MAX, group=group)
    n, nonfinite = int(total[1]), int(total[2])
    figures = {
        "tokens": n,
        "nonfinite_tokens": nonfinite,
        "max_abs_diff": float(biggest[0]) if n - nonfinite > 0 else float("nan"),
        "mean_abs_diff": float(total[0]) / (n - nonfinite) if n - nonfinite > 0 else float("nan"),
    }
    agreement["all_ranks"] = figures
    if agreement.get("version_lag", 0) != 0:
        return []
    return problems(figures, thresholds, judge_max=thresholds.step_max)
