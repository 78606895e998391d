"""Telemetry: per-phase time and peak memory on every rank (max over ranks), step records, W&B, plots.

Called by everyone, calls no one: nothing here knows the training loop.
"""
