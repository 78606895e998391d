"""The run's records: its name (names.py), its start and directory (run.py), the console, phase timing
and sinks per step (records.py), and the step's metrics and closing summary (summary.py)."""
