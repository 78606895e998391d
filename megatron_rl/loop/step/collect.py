"""Generate and score one step's samples: each finished completion goes to the reward pool at once.

Prompts are split over engines (engine e takes global prompts e, e + E, e + 2E, ...). Each engine's
TP-rank-0 process streams its finished samples into its share of the reward pool while the engine
keeps generating, so scoring hides behind generation; only what is still being scored when the
last sample finishes shows up as the `scoring` phase. Then every rank receives every scored sample
(all_gather of small Python objects) in prompt-major order.

Separated placement (loop/placement/pools.py): the engine ranks generate and the trainer ranks take part in the
same calls with no engine (`engine=None`): the gathers then run over the job's host group and carry,
besides the samples, the slowest engine's CollectStats, which the trainer's step record reports.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import torch.distributed as dist

from megatron_rl.loop.step.carry import CarriedGroup, carry_split
from megatron_rl.loop.step.rl_batch import gather_parts
from megatron_rl.parallel.schedule import defers_scoring
from megatron_rl.rollout.types import Sample


@dataclass
class CollectStats:
    generated_tokens: int = 0
    generation_s: float = 0.0
    scoring_tail_s: float = 0.0  # scoring time not hidden behind generation (nor, deferred, the forwards)
    # generation's end to the last reward, hidden behind the forwards or not: what the pool took after
    # generation (the planner calibrates scoring with it: plan/calibrate.py)
    scoring_after_s: float = 0.0
    ended_at: float = 0.0  # perf_counter at generation's end, on this process's clock
    # reward fleet (reward/remote.py): samples sent again after a server failed, by this engine leader's
    # pool (own_retries) and over every engine leader (remote_retries: what the step record reports)
    own_retries: int = 0
    remote_retries: int = 0
    scoring_busy_s: float = 0.0  # sum of per-sample sandbox seconds
    samples: int = 0
    # Seconds from the start of each generate call to each of this engine's samples finishing, per call:
    # how long the batch waited on its longest completion (see summary.generation_tail_seconds).
    finish_s: list[list[float]] = field(default_factory=list)
    call_s: list[float] = field(default_factory=list)
    # Peak memory of the engine's phases on its rank (a separated job's trainer records them: loop/placement/feed.py)
    mem_gib: dict[str, float] = field(default_factory=dict)
    # rollout.oversample, over all engines: prompts drawn, and samples cut or dropped with their groups
    drawn_prompts: int = 0
    dropped_samples: int = 0
    # rollout.partial, over all engines: cut samples this batch continued, and samples it cut
    continued_samples: int = 0
    cut_samples: int = 0
    # rollout.env: seconds the engine sat idle with every unfinished trajectory waiting on its environment
    env_wait_s: float = 0.0


class GroupQuota:
    """rollout.oversample: keep the first `keep` prompts whose n samples have all finished (None: all).

    Fed each finished sample's prompt index in finish order; `full` says when enough groups are
    complete, and the engine's stream is then closed (it aborts what still runs). `forced` (partial
    rollouts: groups cut rollout.partial_max_cuts times already) are kept first, and the quota is not full
    until the first `keep` of them are complete."""

    def __init__(self, n: int, keep: int | None, forced: list[int] | None = None):
        self.n, self.keep = n, keep
        self.forced = list(forced or [])[: keep if keep is not None else None]
        self.count: dict[int, int] = {}
        self.complete: list[int] = []

    def add(self, prompt_index: int) -> None:
        c = self.count[prompt_index] = self.count.get(prompt_index, 0) + 1
        if c == self.n:
            self.complete.append(prompt_index)

    @property
    def full(self) -> bool:
        if self.keep is None or len(self.complete) < self.keep:
            return False
        return all(p in self.complete for p in self.forced)

    def kept(self, prompt_index: int) -> bool:
        if self.keep is None:
            return True
        others = [p for p in self.complete if p not in self.forced]
        return prompt_index in self.forced + others[: self.keep - len(self.forced)]


def engine_prompts(num_prompts: int, engine_index: int, engine_count: int) -> list[int]:
    return list(range(engine_index, num_prompts, engine_count))


def oversampled_split(want: int, engine_count: int, factor: float) -> tuple[int, list[list[int]], list[int]]:
    """rollout.oversample's layout of one draw: (prompts to draw, each engine's prompt indices, each
    engine's quota of groups to keep). Engine e keeps its round-robin share q_e of `want` (as without
    oversampling: the first `want` prompts are laid out exactly as then) and generates ceil(q_e x factor)
    prompts: its share plus its extras, which follow the first `want` in engine order. An engine with no
    share draws nothing."""
    quotas = [len(engine_prompts(want, e, engine_count)) for e in range(engine_count)]
    extras = [math.ceil(q * factor - 1e-9) - q for q in quotas]
    out, start = [], want
    for e in range(engine_count):
        out.append(engine_prompts(want, e, engine_count) + list(range(start, start + extras[e])))
        start += extras[e]
    return start, out, quotas


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
    keep_groups: int | None = None,
    carried: dict[int, CarriedGroup] | None = None,
    max_cuts: int = 1,
    deferred: list | None = None,
) -> tuple[list[Sample], list[CarriedGroup]]:
    """This engine's samples, scored, and the groups it cut (only the engine's leader returns them; other
    TP ranks get ([], [])).

    `keep_groups` (rollout.oversample): return only the first `keep_groups` prompts to have all n
    samples finished, and stop generating then; the others' samples are dropped (counted in stats).
    `carried` (rollout.partial; local prompt index -> its carried group): the others are cut and returned
    instead, and the carried groups' cut samples are continued, their finished ones kept as scored.
    `deferred` (a list, the leader's): do not wait for the pool; the samples it still scores are returned
    unscored (status "") and their pool keys appended to `deferred`, for `PendingRewards.wait`."""
    partial = carried is not None
    carried = carried or {}
    forced = [i for i in sorted(carried) if carried[i].cuts >= max_cuts]
    quota = GroupQuota(n, keep_groups, forced)
    # Carried requests first: the engine schedules in arrival order, and a carried group queued behind the
    # fresh ones could wait past the cut batch after batch.
    requests, fresh = [], [i for i in range(len(prompts)) if i not in carried]
    for i, group in sorted(carried.items()):
        for _ in group.finished:
            quota.add(i)
        requests += [replace(c, prompt_index=i) for c in group.partial]
    caps = [getattr(prompts[i], "max_new_tokens", None) for i in fresh]
    for r in engine.requests_for([prompts[i].prompt_ids for i in fresh], n, max_tokens=caps):
        requests.append(replace(r, prompt_index=fresh[r.prompt_index]))
    held = {(r.prompt_index, r.sample_index): len(r.token_ids) for r in requests}
    pending: dict[tuple[int, int], object] = {}
    t0 = time.perf_counter()
    finished: list[float] = []
    # Multi-turn (rollout.env): the turn scheduler that wraps the pool drives each trajectory's turns and
    # grades it through its environment; its samples come scored (rollout/turns.py).
    turns = getattr(pool, "multi_turn", False)
    scored_now: dict[tuple[int, int], Sample] = {}
    with timer.phase("generation"):
        if turns:
            stream = pool.stream(engine, requests, prompts, call_id)
        else:
            stream = engine.generate_requests(requests, call_id=call_id, keep_partial=partial)
        for s in stream if not quota.full else ():
            quota.add(s.prompt_index)
            finished.append(time.perf_counter() - t0)
            stats.generated_tokens += s.generated_tokens - held[(s.prompt_index, s.sample_index)]
            if is_leader:
                key = (global_index[s.prompt_index], s.sample_index)
                if turns:
                    scored_now[key] = s
                else:
                    pending[key] = s
                    pool.submit(key, task.problem(prompts[s.prompt_index]), task.program(s.token_ids))
            if quota.full:
                break
        stream.close()  # aborts what still runs; every rank of the engine stops at the same sample
    stats.env_wait_s += getattr(stream, "env_wait_s", 0.0)
    stats.ended_at = time.perf_counter()
    stats.generation_s += stats.ended_at - t0
    stats.finish_s.append(finished)
    stats.call_s.append(time.perf_counter() - t0)
    cut = list(stream.cut)  # rollout.partial: the requests the close aborted, with their tokens
    stats.generated_tokens += sum(len(c.token_ids) - held[(c.prompt_index, c.sample_index)] for c in cut)
    if not is_leader:
        return [], []
    results = {}
    if deferred is None:
        t1 = time.perf_counter()
        with timer.phase("scoring"):
            for r in pool.results() if not turns else ():
                results[r.sample_id] = r
        stats.scoring_tail_s += time.perf_counter() - t1
        stats.scoring_after_s += time.perf_counter() - t1
        stats.own_retries += _take_retries(pool)
    else:
        deferred += list(pending)
    _note_memory(timer, stats)
    scored: dict[int, list[Sample]] = {i: [replace(x) for x in g.finished] for i, g in carried.items()}
    for s in scored_now.values():
        stats.scoring_busy_s += s.env_seconds
        scored.setdefault(s.prompt_index, []).append(s)
    for key, s in pending.items():
        if deferred is not None:  # scored later, by PendingRewards.wait
            scored.setdefault(s.prompt_index, []).append(replace(s))
            continue
        r = results[key]
        stats.scoring_busy_s += r.seconds
        scored.setdefault(s.prompt_index, []).append(replace(s, reward=float(r.reward), status=r.status))
    out, left = [], []
    for i in range(len(prompts)):
        mine = sorted(scored.get(i, []), key=lambda x: x.sample_index)
        if quota.kept(i):  # the engine's own (local) prompt index
            out += [replace(x, prompt_index=global_index[i]) for x in mine]
        elif partial:  # cut: carried into the next batch with what it has
            rest = [c for c in cut if c.prompt_index == i]
            # a cut counts for a group that has something, or was carried already (it waited a batch, and
            # must become one the batch waits for); a new group the quota left untouched is not older for it
            started = bool(mine) or any(c.token_ids for c in rest) or i in carried
            cuts = (carried[i].cuts if i in carried else 0) + int(started)
            left.append(CarriedGroup(prompts[i], mine, rest, cuts))
        # else: generated and scored, but its group finished after the quota was met: dropped
    stats.samples += len(out)
    return out, left


def _take_retries(pool) -> int:
    """The fleet's re-sends since the last call (a multi-turn scheduler's pool scores through its env)."""
    take = getattr(pool, "take_retries", None)
    return take() if take is not None else 0


def _note_memory(timer, stats: CollectStats) -> None:
    for name in ("generation", "scoring"):
        if name in getattr(timer, "stats", {}):
            stats.mem_gib[name] = max(stats.mem_gib.get(name, 0.0), timer.stats[name].mem_gib)


class PendingRewards:
    """A batch whose verifier rewards the reward pool is still computing (collect_batch with `defer`).

    The trainer's forwards that need no reward (old-policy and reference log-probs, a critic's values)
    run while the pool scores; `wait` then takes the last results, and every rank fills them into its
    samples, in place. What the wait lasts is the step's `scoring` phase: the scoring that generation and
    those forwards did not hide. Collective over the batch's host group: every rank calls `wait` once."""

    def __init__(
        self, samples: list[Sample], keys: list[tuple], pool, expected: list, cpu_group, timer, stats
    ):
        """`keys[i]`: samples[i]'s pool key; `pool`, `expected`: the engine leader's pool and the keys it
        still scores (None and [] elsewhere); `cpu_group`: the batch's host (gloo) group."""
        self.samples, self.keys, self.pool, self.expected = samples, keys, pool, expected
        self.cpu_group, self.timer, self.stats = cpu_group, timer, stats
        self.done = False

    def wait(self) -> None:
        if self.done:
            raise RuntimeError("PendingRewards.wait() called twice: the batch is scored already")
        got: dict = {}
        t1 = time.perf_counter()
        with self.timer.phase("scoring"):
            after, retries = 0.0, 0
            if self.pool is not None and self.expected:
                for r in self.pool.results():
                    got[r.sample_id] = (float(r.reward), r.status, float(r.seconds))
                after = max(0.0, self.pool.last_result_at - self.stats.ended_at)
                retries = _take_retries(self.pool)
            parts = gather_parts((got, after, retries), self.cpu_group)
            merged = {k: v for p in parts for k, v in (p[0] if p else {}).items()}
        missing = [k for k in self.expected if k not in got]
        if missing:
            raise RuntimeError(
                f"the reward pool returned no result for {len(missing)} samples: {missing[:4]}"
            )
        self.stats.scoring_tail_s += time.perf_counter() - t1
        self.stats.scoring_after_s += max(p[1] for p in parts if p)  # the leader that finished last
        self.stats.remote_retries += sum(p[2] for p in parts if p)
        # an engine leader's own sandbox seconds; a rank without a pool (a separated trainer, whose stats are
        # the slowest engine's) the busiest leader's
        busy = [sum(v[2] for v in (p[0] if p else {}).values()) for p in parts]
        self.stats.scoring_busy_s += sum(v[2] for v in got.values()) if self.pool is not None else max(busy)
        _note_memory(self.timer, self.stats)
        for s, key in zip(self.samples, self.keys):
            if s.status:  # scored already (a carried or multi-turn sample)
                continue
            if key not in merged:  # fail closed: an unscored sample never trains with reward 0
                raise RuntimeError(
                    f"sample {key} of the batch was never scored: no engine leader returned it"
                )
            s.reward, s.status, _ = merged[key]
        self.done = True


def gather_all(
    local: list[Sample],
    cpu_group=None,
    stats: CollectStats | None = None,
    cut: list[CarriedGroup] | None = None,
) -> tuple[list[Sample], CollectStats | None, list[CarriedGroup]]:
    """Every rank's scored samples on every rank, over `cpu_group` (gloo: a batch of samples, with routes
    under routing replay, is far too big to stage on the GPU as NCCL's object collectives do), prompt-major
    (the order group advantages need); of the
    `stats` the ranks passed, the slowest engine's (a separated job's trainer ranks have none of their
    own; the step's generation is as long as its slowest engine); and every rank's cut groups, in rank
    order (rollout.partial: every rank holds the same carry)."""
    cut = list(cut or [])
    if dist.is_initialized() and dist.get_world_size(cpu_group) > 1:
        parts = gather_parts((local, stats, cut), cpu_group)
        local = [s for p in parts for s in (p[0] if p else [])]
        cut = [g for p in parts for g in (p[2] if p else [])]
        given = [p[1] for p in parts if p and p[1] is not None]
        stats = max(given, key=lambda c: c.generation_s + c.scoring_tail_s) if given else None
        if stats is not None:  # timings: the slowest engine's; memory: the largest of any engine
            stats.mem_gib = {k: max(c.mem_gib.get(k, 0.0) for c in given) for k in stats.mem_gib}
            stats.remote_retries = sum(c.own_retries for c in given)  # counts: every engine's
    elif stats is not None:
        stats.remote_retries = stats.own_retries
    return sorted(local, key=lambda s: (s.prompt_index, s.sample_index)), stats, cut


def _groups(samples: list[Sample]) -> list[list[Sample]]:
    out: dict[int, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.prompt_index, []).append(s)
    return [out[k] for k in sorted(out)]


def collect_batch(
    cfg,
    engine,
    engine_index: int,
    is_leader: bool,
    task,
    pool,
    timer,
    step: int,
    group=None,
    carry=None,
    defer: bool = False,
):
    """One step's batch: `data.prompts_per_step` groups of `samples_per_prompt` scored samples.

    `group`: the job's host (gloo) group, over which every gather of this call runs (loop/placement/pools.py when
    separated). `engine` None: a separated job's trainer rank, which receives the batch.

    `carry` (rollout.partial; a list, the same on every rank): the groups earlier batches cut, continued
    first; replaced in place by the groups this batch cuts (loop/step/carry.py).

    With `algorithm.dynamic_sampling`, groups whose rewards are all equal (no learning signal) are set
    aside and more prompts are drawn, up to `max_resample_rounds` extra rounds; if the rounds run out,
    set-aside groups fill the batch (their advantages are zero, so they add no gradient) and the batch
    keeps its shape. Returns (samples in prompt-major order, CollectStats, rounds drawn).

    `defer` (where parallel/schedule.py `defers_scoring`): the samples come back as soon as generation
    ends, unscored, with a fourth value, the PendingRewards whose `wait` scores them; otherwise the fourth
    value is None.
    """
    from megatron_rl.algorithms import fill_batch, informative_groups

    algo, ro, n, target = (
        cfg.algorithm,
        cfg.rollout,
        cfg.rollout.samples_per_prompt,
        cfg.data.prompts_per_step,
    )
    partial = ro.partial
    if defer and not defers_scoring(algo, ro, 0):
        raise ValueError("a batch of dynamic sampling, partial rollouts or multi-turn cannot be scored later")
    deferred: list | None = [] if defer else None
    if partial and (carry is None or algo.dynamic_sampling):
        raise ValueError("rollout.partial needs the run's carry, and does not combine with dynamic sampling")
    stats = CollectStats()
    kept: list[list[Sample]] = []
    spare: list[list[Sample]] = []
    drawn, rounds, want = 0, 0, target
    while want > 0:
        carried = list(carry) if partial else []
        if partial:
            count, split, quotas = carry_split(want, cfg.layout.engine_count, ro.oversample, len(carried))
        else:
            count, split, quotas = oversampled_split(want, cfg.layout.engine_count, ro.oversample)
        items = carried + task.draw(count)  # partial: carried groups first, then the new prompts
        stats.drawn_prompts += count
        if not partial:
            stats.dropped_samples += (len(items) - want) * n
        local, cut = [], []
        if engine is not None and split[engine_index]:
            mine, quota = split[engine_index], quotas[engine_index]
            local, cut = generate_and_score(
                engine,
                is_leader,
                [items[i].prompt if i < len(carried) else items[i] for i in mine],
                mine,
                n,
                task,
                pool,
                timer,
                stats,
                call_id=step * 1000 + rounds,
                keep_groups=quota if len(mine) > quota else None,
                carried={k: items[i] for k, i in enumerate(mine) if i < len(carried)} if partial else None,
                max_cuts=ro.partial_max_cuts,
                deferred=deferred,
            )
        # Engine leaders send their timing for a trainer that has none of its own (separated).
        own = stats if engine is not None and is_leader else None
        gathered, theirs, cut = gather_all(local, group, own, cut)
        if engine is None and theirs is not None:
            stats = theirs
        elif theirs is not None:
            stats.remote_retries = theirs.remote_retries
        else:  # alone: this pool's own
            stats.remote_retries = stats.own_retries
        if partial:  # counted from the carry, which every rank holds whole (samples that hold tokens)
            stats.continued_samples += sum(bool(c.token_ids) for g in carried for c in g.partial)
            stats.cut_samples += sum(bool(c.token_ids) for g in cut for c in g.partial)
            carry[:] = cut
        groups = _groups(gathered)
        if not algo.dynamic_sampling:
            kept = groups
            break
        import torch

        rewards = torch.tensor([s.reward for g in groups for s in g], device="cpu")
        informative = informative_groups(rewards, n).tolist()
        kept += [g for g, keep in zip(groups, informative) if keep]
        spare += [g for g, keep in zip(groups, informative) if not keep]
        drawn += want
        want = fill_batch(
            len(kept),
            target,
            drawn,
            resample_rounds_done=rounds,
            max_resample_rounds=algo.max_resample_rounds,
        )
        rounds += 1
    batch = (kept + spare)[:target]
    samples, keys = [], []
    for new_index, members in enumerate(batch):
        for s in members:
            keys.append((s.prompt_index, s.sample_index))  # the pool's key: the prompt's index in its draw
            s.prompt_index = new_index
            samples.append(s)
    pending = None
    if defer:
        leader = engine is not None and is_leader
        pending = PendingRewards(
            samples, keys, pool if leader else None, deferred if leader else [], group, timer, stats
        )
    return samples, stats, rounds, pending
