"""A preempted separated run tells the engines to stop only while they still wait for a next step:
after the last step they have left their loop for the final barrier, and a STOP there would never be
matched (both pools would hang until the process-group timeout)."""

from types import SimpleNamespace as NS

from megatron_rl.loop.placement import feed as feed_mod
from megatron_rl.loop.placement import separated


def _feed(monkeypatch, steps, sent):
    monkeypatch.setattr(separated.dist, "broadcast_object_list", lambda box, src, group: None)
    monkeypatch.setattr(separated, "control", lambda procs, word: sent.append(word))
    cfg = NS(
        steps=steps, rollout=NS(max_staleness=1, partial=False, env=""), algorithm=NS(dynamic_sampling=False)
    )
    run = NS(recipe=cfg, staleness=1, spec=None, layout=NS(tp=1))
    task = NS(state=lambda: {"drawn": 0})
    return separated.SeparatedFeed(run, NS(job_cpu_group=None), NS(), None, task, None, 0)


def test_stop_is_sent_before_the_last_step_and_not_after_it(monkeypatch):
    sent: list = []
    f = _feed(monkeypatch, 5, sent)
    f.stop(2)
    assert sent == [feed_mod.STOP]
    f.stop(4)  # the last step: the engines are at the barrier
    assert sent == [feed_mod.STOP]


def test_saved_task_state_never_moves_with_the_live_task(monkeypatch):
    """The state kept for a checkpoint is a copy: a task whose state() hands out its live lists (as a
    problem set's draw order) must not shift the saved position when it draws on."""
    sent: list = []
    f = _feed(monkeypatch, 5, sent)
    live = {"order": [3, 1, 2], "drawn": 0}
    f.task = NS(state=lambda: live)
    f.log = NS(phase=lambda name: __import__("contextlib").nullcontext(), timer=NS(add=lambda *a: None))
    monkeypatch.setattr(
        separated,
        "collect_batch",
        lambda *a, **k: (live["order"].pop(), NS(generation_s=0.0, scoring_tail_s=0.0, mem_gib={}), 0, None),
    )
    f._receive(1)
    assert live["order"] == [3, 1]
    assert f.task_state(1) == {"order": [3, 1, 2], "drawn": 0}
