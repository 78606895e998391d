"""rollout.oversample's rule: keep the first `keep` prompts whose n samples have all finished."""

from megatron_rl.loop.collect import GroupQuota


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
