"""Generate and score one step's samples: each finished completion goes to the reward pool at once.

Prompts are split over engines (engine e takes global prompts e, e + E, e + 2E, ...). Each engine's
TP-rank-0 process streams its finished samples into its share of the reward pool while the engine
keeps generating, so scoring hides behind generation; only what is still being scored when the
last sample finishes shows up as the `scoring` phase. Then every rank receives every scored sample
(all_gather of small Python objects) in prompt-major order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch.distributed as dist

from megatron_rl.loop.rl_batch import ScoredSample


@dataclass
class CollectStats:
    generated_tokens: int = 0
    generation_s: float = 0.0
    scoring_tail_s: float = 0.0  # scoring time not hidden behind generation
    scoring_busy_s: float = 0.0  # sum of per-sample sandbox seconds
    samples: int = 0


def engine_prompts(num_prompts: int, engine_index: int, engine_count: int) -> list[int]:
    return list(range(engine_index, num_prompts, engine_count))


def generate_and_score(
    engine,
    is_leader: bool,
    prompts,
    global_index: list[int],
    n: int,
    task,
    pool,
    timer,
    stats: CollectStats,
    call_id: int,
) -> list[ScoredSample]:
    """This engine's samples, scored (only the engine's leader returns them; other TP ranks get [])."""
    pending: dict[tuple[int, int], object] = {}
    t0 = time.perf_counter()
    with timer.phase("generation"):
        for s in engine.generate_stream([p.prompt_ids for p in prompts], n, call_id=call_id):
            stats.generated_tokens += len(s.token_ids)
            if is_leader:
                key = (global_index[s.prompt_index], s.sample_index)
                pending[key] = s
                pool.submit(key, task.problem(prompts[s.prompt_index]), task.program(s.token_ids))
    stats.generation_s += time.perf_counter() - t0
    if not is_leader:
        return []
    t1 = time.perf_counter()
    results = {}
    with timer.phase("scoring"):
        for r in pool.results():
            results[r.sample_id] = r
    stats.scoring_tail_s += time.perf_counter() - t1
    out = []
    for key, s in pending.items():
        r = results[key]
        stats.scoring_busy_s += r.seconds
        out.append(
            ScoredSample(
                prompt_index=key[0],
                sample_index=key[1],
                prompt_ids=list(s.prompt_ids),
                token_ids=list(s.token_ids),
                logprobs=list(s.logprobs),
                truncated=bool(s.truncated),
                version=s.version,
                reward=float(r.reward),
                status=r.status,
            )
        )
    stats.samples += len(out)
    return out


def gather_all(local: list[ScoredSample]) -> list[ScoredSample]:
    """Every rank's scored samples on every rank, prompt-major (the order group advantages need)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts: list[list[ScoredSample] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local)
        local = [s for p in parts for s in (p or [])]
    return sorted(local, key=lambda s: (s.prompt_index, s.sample_index))
