"""What the trainer's feed keeps of partial rollouts' carry: a resumed carry only under the settings it
was cut with, positions only as long as a save can need them, and the lag of versions from before a
resume."""

from types import SimpleNamespace as NS

import pytest

from megatron_rl.loop.placement import feed as feed_mod


def _cfg(partial=True, n=4, prompts=4, oversample=1.5, max_new=16):
    return NS(
        steps=8,
        layout=NS(placement="colocated", synchrony="sync"),
        rollout=NS(
            max_staleness=1,
            partial=partial,
            samples_per_prompt=n,
            max_new_tokens=max_new,
            oversample=oversample,
            env="",
        ),
        data=NS(prompts_per_step=prompts),
        algorithm=NS(dynamic_sampling=False),
    )


def _saved(**changes):
    return {"settings": {**feed_mod.carry_settings(_cfg()), **changes}, "groups": [{"any": "group"}]}


def test_a_carry_is_refused_when_partial_rollouts_are_off_or_its_settings_changed():
    with pytest.raises(SystemExit, match="rollout.partial=false: their prompts were drawn"):
        feed_mod.resumed_carry(_cfg(partial=False), _saved())
    with pytest.raises(SystemExit, match="samples_per_prompt was 2, now 4"):
        feed_mod.resumed_carry(_cfg(), _saved(samples_per_prompt=2))
    with pytest.raises(SystemExit, match="oversample was 2.0, now 1.5"):
        feed_mod.resumed_carry(_cfg(), _saved(oversample=2.0))
    with pytest.raises(SystemExit, match="without the settings they were cut under"):
        feed_mod.resumed_carry(_cfg(), [{"any": "group"}])
    assert feed_mod.resumed_carry(_cfg(), _saved()) == [{"any": "group"}]
    # nothing carried (or an older checkpoint without a carry): any settings resume
    assert feed_mod.resumed_carry(_cfg(partial=False), None) == []
    assert feed_mod.resumed_carry(_cfg(partial=False), {"settings": {}, "groups": []}) == []


def _colocated_feed(monkeypatch, start=0):
    from megatron_rl.loop.placement import colocated

    live = {"drawn": 0}
    task = NS(state=lambda: dict(live))

    def collect(*a, **k):
        live["drawn"] += 1
        k["carry"][:] = [f"group cut by batch {live['drawn']}"]
        return [], NS(), 0

    monkeypatch.setattr(colocated, "collect_batch", collect)
    side = colocated.EngineSide(NS(to_train=lambda: None), None, 0, True, None)
    run = NS(recipe=_cfg(), staleness=0, spec=None, layout=NS(tp=1))
    f = colocated.ColocatedFeed(
        run, NS(job_cpu_group=None), NS(timer=None), None, task, None, start, None, None, side
    )
    monkeypatch.setattr(feed_mod, "carry_record", lambda carry, task: list(carry))
    return f


def test_positions_are_kept_only_while_a_save_can_need_them(monkeypatch):
    f = _colocated_feed(monkeypatch)
    for step in range(6):
        f.batch(step)
    assert sorted(f.task_states) == [5]  # the copies of earlier steps' carry are gone
    # a save after step 5 (sync: before batch 6 is drawn) takes the live position and carry
    assert f.task_state(6) == {"drawn": 6}
    assert f.carry_state(6)["groups"] == ["group cut by batch 6"]
    assert f.carry_state(6)["settings"] == feed_mod.carry_settings(_cfg())


def test_tokens_of_versions_published_before_a_resume_show_their_lag(monkeypatch):
    f = _colocated_feed(monkeypatch, start=3)
    # resumed at step 3: version 2 (the policy after 1 update) was published at step 1
    assert f.lag_of(2, 3) == 2 and f.lag_of(3, 3) == 1
    carried = NS(version=2, versions=[2, 2, 4])
    assert f.lag([carried], 3)["max"] == 2
