"""Every rank's phases per step as a Chrome trace (Trace Event Format), for ui.perfetto.dev or
chrome://tracing: one track per rank, one complete event ("ph": "X") per phase call, labelled with its
step, so a slow rank or a rank waiting in a collective shows at a glance.

Spans come from the step records' `spans_by_rank` ([phase, start, end] in wall-clock seconds since the
epoch, per rank); times in the trace are microseconds from the run's first span.
"""

from __future__ import annotations

import json
from pathlib import Path


def trace_events(records: list[dict]) -> dict:
    """The trace as a dict; raises ValueError when the records hold no per-rank spans."""
    spans = [
        (r["step"], rank, s)
        for r in records
        for rank, ss in enumerate(r.get("spans_by_rank") or [])
        for s in ss
    ]
    if not spans:
        raise ValueError(
            "these step records hold no per-rank phase spans (spans_by_rank); runs recorded before "
            "spans were added cannot be traced: run again to get a trace"
        )
    t0 = min(s[1] for _, _, s in spans)
    ranks = sorted({rank for _, rank, _ in spans})
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "megatron-rl run"}}
    ]
    events += [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}}
        for rank in ranks
    ]
    for step, rank, (name, start, end) in spans:
        events.append(
            {
                "name": name,
                "cat": "phase",
                "ph": "X",
                "pid": 0,
                "tid": rank,
                "ts": round((start - t0) * 1e6, 1),
                "dur": round(max(end - start, 0.0) * 1e6, 1),
                "args": {"step": step},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(records: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace_events(records)))
    return path
