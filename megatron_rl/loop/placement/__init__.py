"""Where the run's pieces live and how they meet: process groups and separated pools (processes.py,
pools.py), the trainer's side of rollout in either placement (feed.py), time-sharing one device
(timeshare.py), an engine rank of a separated job (engine_pool.py), and what a refused or disagreeing
publication does (publication.py, probe.py)."""
