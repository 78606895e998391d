"""Telemetry: per-phase time and peak memory on every rank (max over ranks), step records, W&B, plots,
the quiet console (everything into log.txt), and `megatron-rl report` (report.py, trace.py).

Called by everyone, calls no one: nothing here knows the training loop.
"""
