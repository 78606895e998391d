"""The meeting order of a separated job's pools (parallel/schedule.py), simulated from both sides.

The trainer (loop/placement/feed.py via train.py) and the engines (loop/placement/engine_pool.py) walk the schedule with
different code; here both walks are replayed as event lists and must match op for op (a mismatch is a
deadlock on the job group), and the trainer's view gives the version lag of every batch."""

import pytest

from megatron_rl.parallel import schedule


def trainer_events(start, k, steps):
    """What train.py does per step: publish, take the batch (receiving the due ones), train, receive."""
    out, updates, held = [], start, {}
    for step in range(start, steps):
        out.append(("control",))
        if schedule.publish_due(step, start, k, steps):
            out.append(("publish", updates + 1))
            version = updates + 1
        for t in schedule.batches_before_train(step, start, k, steps):
            out.append(("batch", t))
            held[t] = version
        assert step in held, f"step {step} has no batch"
        yield_lag = updates - (held.pop(step) - 1)  # updates the trained policy is ahead of the sampler
        out.append(("train", step, yield_lag))
        updates += 1
        for t in schedule.batches_after_train(step, k, steps):
            out.append(("batch", t))
            held[t] = version
    assert not held, f"batches drawn and never trained: {sorted(held)}"
    return out


def engine_events(start, k, steps):
    out, version = [], None
    for step in range(start, steps):
        out.append(("control",))
        if schedule.publish_due(step, start, k, steps):
            version = step + 1  # what the trainer sends at this step
            out.append(("publish", version))
        for t in schedule.batches_before_train(step, start, k, steps) + schedule.batches_after_train(
            step, k, steps
        ):
            out.append(("batch", t))
            assert version == schedule.sampling_version(t, start, k)
    return out


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("start,steps", [(0, 1), (0, 2), (0, 7), (3, 9), (5, 6)])
def test_both_pools_walk_the_same_meetings_and_the_lag_stays_within_k(k, start, steps):
    tr = trainer_events(start, k, steps)
    meet = [e for e in tr if e[0] != "train"]
    assert meet == engine_events(start, k, steps)
    batches = [e[1] for e in meet if e[0] == "batch"]
    assert batches == list(range(start, steps)), "every batch drawn once, in order"
    lags = [e[2] for e in tr if e[0] == "train"]
    assert all(0 <= lag <= k for lag in lags)
    # the lag is k once the pipeline is full (a resumed run starts with a fresh, lag-0 fill)
    assert lags[: min(k, len(lags))] == list(range(min(k, len(lags))))
    assert all(lag == k for lag in lags[k:])


def test_async_overlaps_generation_with_training():
    """With k = 1 the batch of step s+1 is drawn between training s and the next publication."""
    ev = trainer_events(0, 1, 4)
    i = ev.index(("train", 1, 1))
    assert ev[i + 1] == ("batch", 2) and ev[i - 1] == ("publish", 2)
    assert trainer_events(0, 0, 3)[1:4] == [("publish", 1), ("batch", 0), ("train", 0, 0)]


def test_staleness_only_for_separated_async():
    from types import SimpleNamespace as NS

    ro = NS(max_staleness=2)
    assert schedule.staleness(NS(placement="separated", synchrony="async"), ro) == 2
    assert schedule.staleness(NS(placement="separated", synchrony="sync"), ro) == 0
    assert schedule.staleness(NS(placement="colocated", synchrony="sync"), ro) == 0
