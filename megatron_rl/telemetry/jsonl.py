"""Reading a run's JSON-lines files (steps.jsonl, spans.jsonl) the way a killed run leaves them.

A run killed mid-write leaves a truncated last line: that one is skipped with a warning, so the
report still reads everything before it. A bad line anywhere else is corruption, and an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def read_jsonl(path: Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, object]]:
    """(line number, decoded value) for each non-blank line; raises `error` naming a bad line."""
    lines = path.read_text().splitlines()
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            if lineno != last:
                raise error(f"{path}:{lineno}: not JSON ({e.msg})") from None
            log.warning("%s:%d: skipping a truncated last line (the run was stopped mid-write)", path, lineno)
