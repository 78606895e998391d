"""`megatron-rl report RUN_DIR [--compare RUN2] [--json] [--trace F] [--plot F]`: read a run's steps.jsonl."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

from megatron_rl.config.schema import LoggerConfig
from megatron_rl.loop.record.signal import longest_flat_stretch
from megatron_rl.telemetry.report import ReportError, load_records, render, render_compare, summarize


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-rl report",
        description="Where a run's time and memory went: per-phase seconds and peak memory, idle time, "
        "throughput, MFU and learning trends, from RUN_DIR/steps.jsonl.",
    )
    p.add_argument("run", metavar="RUN_DIR", help="a run's output folder (outputs/<run>/) or its steps.jsonl")
    p.add_argument("--compare", metavar="RUN2", help="a second run to put side by side (B) with RUN_DIR (A)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--trace", metavar="FILE", help="write every rank's phases as a Chrome/Perfetto trace")
    p.add_argument("--plot", metavar="FILE", help="write a PNG: phases per step, memory, and the trends")
    return p


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _run_dir(run: str) -> Path:
    path = Path(run)
    return path if path.is_dir() else path.parent


def no_signal_steps(run: str) -> int:
    """The run's own `logger.no_signal_steps` (from the recipe.json beside its steps.jsonl), else the default."""
    try:
        return int(json.loads((_run_dir(run) / "recipe.json").read_text())["logger"]["no_signal_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return LoggerConfig.no_signal_steps


def learning_summary(run: str, records: list[dict]) -> dict:
    """The report's summary with its verdict on the learning signal: the longest stretch of steps whose
    every group got one reward, when it is at least the run's `logger.no_signal_steps` (loop/record/signal.py)."""
    samples = _run_dir(run) / "samples.jsonl"
    where = str(samples) if samples.is_file() else ""
    return {**summarize(records), "no_signal": longest_flat_stretch(records, no_signal_steps(run), where)}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    # Our warnings (a truncated last line skipped) as one line each on stderr.
    logging.basicConfig(level=logging.WARNING, format="megatron-rl report: warning: %(message)s")
    try:
        records = load_records(args.run)
        other = load_records(args.compare) if args.compare else None
        summary = learning_summary(args.run, records)
        if args.trace:
            from megatron_rl.telemetry.trace import load_spans, write_trace

            write_trace(records, args.trace, load_spans(args.run))
        if args.plot:
            from megatron_rl.telemetry.plots import plot_report

            plot_report(records, args.plot)
    except (ReportError, ValueError) as e:
        print(f"megatron-rl report: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # --trace/--plot to a folder that cannot be written, a full disk, an unreadable run
        what = f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)
        print(f"megatron-rl report: {what}", file=sys.stderr)
        return 2
    if args.json:
        out = {"run": str(args.run), **summary}
        if other is not None:
            out = {"A": out, "B": {"run": str(args.compare), **learning_summary(args.compare, other)}}
        print(json.dumps(_clean(out), indent=1))
    elif other is not None:
        print(
            render_compare(summary, learning_summary(args.compare, other), str(args.run), str(args.compare)),
            end="",
        )
    else:
        print(render(summary, str(args.run)), end="")
    written = [f"{what} written to {f}" for what, f in (("trace", args.trace), ("plot", args.plot)) if f]
    if written and not args.json:
        print("; ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
