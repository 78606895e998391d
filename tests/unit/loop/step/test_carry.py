"""Partial rollouts' bookkeeping: how carried groups are dealt, which groups a batch keeps, and the
carry's checkpoint form."""

import json
import random
from dataclasses import replace

import pytest

from megatron_rl.data.synthetic import ArithmeticTask
from megatron_rl.loop.step.carry import CarriedGroup, carry_from_record, carry_record, carry_split
from megatron_rl.loop.step.collect import GroupQuota
from megatron_rl.rollout.types import Partial, Sample


def test_carried_groups_come_first_and_the_draw_tops_up_each_engine_to_f_times_its_share():
    # nothing carried: the same in-flight count as oversampling alone (ceil(4 x 1.5) = 6)
    assert carry_split(4, 1, 1.5, 0) == (6, [[0, 1, 2, 3, 4, 5]], [4])
    # 2 carried (positions 0, 1) + 4 new: the steady state draws what it trains
    assert carry_split(4, 1, 1.5, 2) == (4, [[0, 1, 2, 3, 4, 5]], [4])
    # two engines: carried dealt round robin, each topped up to ceil(2 x 1.5) = 3 in flight
    new, split, quotas = carry_split(4, 2, 1.5, 3)
    assert quotas == [2, 2] and split == [[0, 2, 3], [1, 4, 5]] and new == 3
    # more carried than f x share (a resume into fewer engines): no new prompt, but never below the share
    new, split, quotas = carry_split(2, 1, 1.5, 5)
    assert new == 0 and split == [[0, 1, 2, 3, 4]]
    # every position is dealt exactly once
    for want, engines, f, carried in [(7, 3, 1.5, 4), (5, 2, 2.0, 0), (8, 4, 1.25, 9)]:
        new, split, _ = carry_split(want, engines, f, carried)
        assert sorted(i for s in split for i in s) == list(range(carried + new))


def test_groups_cut_max_cuts_times_are_kept_first_and_waited_for():
    q = GroupQuota(n=2, keep=2, forced=[3])
    for p in [0, 0, 1, 1]:  # two others complete first: not full, the forced group is still running
        q.add(p)
        assert not q.full
    q.add(3)
    q.add(3)
    assert q.full and q.kept(3) and q.kept(0) and not q.kept(1)
    # more forced than the quota: the first `keep` are waited for, the rest may be cut again
    q = GroupQuota(n=1, keep=1, forced=[5, 6])
    q.add(6)
    assert not q.full
    q.add(5)
    assert q.full and q.kept(5) and not q.kept(6)


def _group(task):
    prompt = task.draw(1)[0]
    done = Sample(
        0, 0, prompt.prompt_ids, [5, 6], [-0.5, -0.25], "stop", False, 1, reward=0.75, status="pass"
    )
    cut = Partial(0, 1, prompt.prompt_ids, [7, 8, 9], [-1.0, -1.5, -2.0], [1, 2, 2], max_tokens=8)
    return CarriedGroup(prompt, [done], [cut], cuts=2)


def test_the_carry_survives_its_checkpoint_form_exactly():
    task = ArithmeticTask(seed=3, tail_share=0.5, short_answer_tokens=2)
    groups = [_group(task), _group(task)]
    records = json.loads(json.dumps(carry_record(groups, task)))
    assert carry_from_record(records, ArithmeticTask(seed=99)) == groups
    assert carry_from_record(None, task) == [] and carry_from_record([], task) == []


def test_a_problem_carried_from_other_data_is_refused():
    from megatron_rl.data.task import ProblemTask
    from megatron_rl.reward.problem import Problem

    class Tok:
        chat_template = None

        def encode(self, text):
            return [ord(c) % 50 + 3 for c in text]

    problems = [Problem(id=f"p{i}", prompt=f"write f{i}", tests="assert True") for i in range(3)]
    task = ProblemTask(problems, Tok(), seed=0)
    prompt = task.draw(1)[0]
    record = task.prompt_record(prompt)
    assert task.prompt_from_record(record) == prompt
    other = ProblemTask(list(reversed(problems)), Tok(), seed=0)
    with pytest.raises(ValueError, match="resume with the data the run started with"):
        other.prompt_from_record(record)


def test_versions_per_token_are_validated():
    with pytest.raises(ValueError, match="go backwards"):
        Sample(0, 0, [1], [2, 3], [-1.0, -1.0], "stop", False, 2, token_versions=[2, 1])
    with pytest.raises(ValueError, match="not the version of its first token"):
        Sample(0, 0, [1], [2, 3], [-1.0, -1.0], "stop", False, 2, token_versions=[1, 2])
    with pytest.raises(ValueError, match="3 token versions for 2 tokens"):
        Sample(0, 0, [1], [2, 3], [-1.0, -1.0], "stop", False, 1, token_versions=[1, 1, 2])
    s = Sample(0, 0, [1], [2, 3], [-1.0, -1.0], "stop", False, 1, token_versions=[1, 2])
    assert s.versions == [1, 2]
    assert Sample(0, 0, [1], [2, 3], [-1.0, -1.0], "stop", False, 4).versions == [4, 4]
    with pytest.raises(ValueError, match="it finished, it is not partial"):
        Partial(0, 0, [1], [2, 3], [-1.0, -1.0], [1, 1], max_tokens=2)


def test_the_tail_task_caps_most_answers_short_and_leaves_the_stream_alone_without_a_tail():
    plain, tail = ArithmeticTask(seed=0), ArithmeticTask(seed=0, tail_share=0.25, short_answer_tokens=3)
    assert all(p.max_new_tokens is None for p in plain.draw(50))
    caps = [p.max_new_tokens for p in tail.draw(400)]
    long_share = caps.count(None) / len(caps)
    assert set(caps) == {None, 3} and 0.18 < long_share < 0.32
    # without a tail the prompts are those the task always drew: one randint per prompt, nothing else
    rng = random.Random(0)
    assert [p.target for p in ArithmeticTask(seed=0).draw(20)] == [rng.randint(0, 20) for _ in range(20)]


class _ArrivalOrderEngine:
    """Serves requests strictly in arrival order, `slots` at a time, one token per step each, as a full
    engine's scheduler does; every sample runs to its cap. Records the order requests arrived in."""

    def __init__(self, slots: int):
        self.slots, self.arrived = slots, []

    def requests_for(self, prompts, n, max_tokens=None):
        return [
            Partial(i, s, list(p), [], [], [], max_tokens=3) for i, p in enumerate(prompts) for s in range(n)
        ]

    def generate_requests(self, requests, call_id=None, keep_partial=False):
        self.arrived = [(r.prompt_index, r.sample_index) for r in requests]
        held = {(r.prompt_index, r.sample_index): r for r in requests}
        engine = self

        class Stream:
            cut: list = []

            def __iter__(self):
                running = list(requests)
                while running:
                    for r in running[: engine.slots]:
                        key = (r.prompt_index, r.sample_index)
                        tokens, logprobs, versions = [*r.token_ids, 7], [*r.logprobs, -1.0], [*r.versions, 2]
                        if len(tokens) < r.max_tokens:
                            held[key] = replace(r, token_ids=tokens, logprobs=logprobs, versions=versions)
                            running = [held.get((x.prompt_index, x.sample_index), x) for x in running]
                            continue
                        running = [x for x in running if (x.prompt_index, x.sample_index) != key]
                        del held[key]
                        yield Sample(*key, r.prompt_ids, tokens, logprobs, "length", True, 2)

            def close(self):
                self.cut = [r for r in held.values()]

        return Stream()


def test_carried_groups_are_served_before_new_ones_and_cannot_wait_forever():
    """Queued behind the new prompts, carried groups that never got a slot would be carried untouched
    batch after batch (never trained, never forced). They go first, and a carried group cut again is
    charged the cut even with nothing generated."""
    from types import SimpleNamespace as NS

    from megatron_rl.loop.step.collect import CollectStats, generate_and_score
    from megatron_rl.telemetry.phases import PhaseTimer

    task = ArithmeticTask(seed=1)
    prompts = task.draw(4)
    untouched = CarriedGroup(
        prompts[0], [], [Partial(0, s, prompts[0].prompt_ids, [], [], [], 3) for s in range(2)], cuts=0
    )
    engine = _ArrivalOrderEngine(slots=4)
    pool = NS(
        submit=lambda *a: None,
        results=lambda: [
            NS(sample_id=(g, s), seconds=0.0, reward=1.0, status="pass") for g in range(4) for s in range(2)
        ],
    )
    task.problem, task.program = (lambda p: None), (lambda ids: "")
    out, cut = generate_and_score(
        engine, True, prompts, [0, 1, 2, 3], 2, task, pool, PhaseTimer(), CollectStats(), 0,
        keep_groups=2, carried={0: untouched}, max_cuts=2,
    )  # fmt: skip
    assert engine.arrived[:2] == [(0, 0), (0, 1)]  # the carried group's requests arrive first
    assert {s.prompt_index for s in out} == {0, 1}  # and it is among the first groups to finish
    # a carried group cut again with nothing generated is still charged the cut (it becomes forced)
    engine = _ArrivalOrderEngine(slots=0)
    out, cut = generate_and_score(
        engine, True, prompts, [0, 1, 2, 3], 2, task, pool, PhaseTimer(), CollectStats(), 0,
        keep_groups=0, carried={0: untouched}, max_cuts=2,
    )  # fmt: skip
    assert [(g.prompt is prompts[0], g.cuts) for g in cut][0] == (True, 1)
    assert all(g.cuts == 0 for g in cut[1:])  # new groups never started are not charged
