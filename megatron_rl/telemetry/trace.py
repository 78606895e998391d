"""Every rank's phases per step as a Chrome trace (Trace Event Format), for ui.perfetto.dev or
chrome://tracing: one track per rank, one complete event ("ph": "X") per phase call, labelled with its
step, so a slow rank or a rank waiting in a collective shows at a glance.

Spans come from the run's `spans.jsonl` (one line per step: {"step", "spans_by_rank"}, [phase, start,
end] in wall-clock seconds since the epoch, per rank), kept apart from `steps.jsonl` because a line grows
with the number of ranks; step records that hold `spans_by_rank` themselves (runs written before the
split) are read as well. Times in the trace are microseconds from the run's first span.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from megatron_rl.telemetry.jsonl import read_jsonl

log = logging.getLogger(__name__)


def load_spans(run: str | Path) -> dict[int, list]:
    """Per step, every rank's spans from the run's spans.jsonl ({} when there is none).

    A truncated last line (a killed run) is skipped; the last line of a step wins (a resumed run)."""
    path = Path(run)
    path = (path if path.is_dir() else path.parent) / "spans.jsonl"
    if not path.is_file():
        return {}
    out: dict[int, list] = {}
    for _, rec in read_jsonl(path):
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out[rec["step"]] = rec.get("spans_by_rank") or []
    return out


def trace_events(records: list[dict], spans_by_step: dict[int, list] | None = None) -> dict:
    """The trace as a dict; raises ValueError when there are no per-rank spans.

    `spans_by_step` is what `load_spans` read; a step missing there falls back to its record's own
    `spans_by_rank`."""
    spans_by_step = spans_by_step or {}
    spans = [
        (r["step"], rank, s)
        for r in records
        for rank, ss in enumerate(spans_by_step.get(r["step"]) or r.get("spans_by_rank") or [])
        for s in ss
    ]
    if not spans:
        raise ValueError(
            "no per-rank phase spans for these steps (spans.jsonl next to steps.jsonl, or spans_by_rank "
            "in the records); runs recorded before spans were added cannot be traced: run again to get a trace"
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


def write_trace(records: list[dict], path: str | Path, spans_by_step: dict[int, list] | None = None) -> Path:
    path = Path(path)
    events = trace_events(records, spans_by_step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(events))
    return path
