"""rollout.oversample's rule: keep the first `keep` prompts whose n samples have all finished."""

from megatron_rl.loop.step.collect import GroupQuota


def test_the_first_groups_to_complete_are_kept_in_completion_order():
    q = GroupQuota(n=2, keep=2)
    for p in [0, 1, 2, 2, 1]:  # prompt 2 completes first, then prompt 1
        assert not q.full
        q.add(p)
    assert q.full and q.complete == [2, 1]
    assert q.kept(2) and q.kept(1) and not q.kept(0)
    q.add(0)  # a group that completes after the quota was met is still not kept
    assert q.complete == [2, 1, 0] and not q.kept(0)


def test_without_a_quota_everything_is_kept_and_the_stream_never_stops_early():
    q = GroupQuota(n=3, keep=None)
    for p in [0, 0, 0, 1]:
        q.add(p)
        assert not q.full
    assert q.kept(0) and q.kept(1) and q.kept(7)


def test_every_engine_gets_its_own_extras_and_the_first_prompts_keep_their_places():
    from megatron_rl.loop.step.collect import engine_prompts, oversampled_split

    total, split, quotas = oversampled_split(4, 2, 1.25)  # shares 2 + 2, each ceil(2.5) = 3
    assert (total, quotas) == (6, [2, 2])
    assert split == [[0, 2, 4], [1, 3, 5]]
    # factor 1: exactly the layout without over-sampling
    assert oversampled_split(5, 2, 1.0) == (5, [engine_prompts(5, 0, 2), engine_prompts(5, 1, 2)], [3, 2])
    # an engine with no share draws nothing
    total, split, quotas = oversampled_split(1, 2, 2.0)
    assert (total, split, quotas) == (2, [[0, 1], []], [1, 0])
    assert sorted(i for s in oversampled_split(7, 3, 1.5)[1] for i in s) == list(
        range(oversampled_split(7, 3, 1.5)[0])
    )
