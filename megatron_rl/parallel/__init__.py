"""Rank arithmetic, pure (no torch): the one parallel-layout type and its rules, the launcher's
environment, and the schedule both pools of a separated job follow.

    layout.py    ParallelLayout: trainer TP/PP/DP/CP/EP(/ETP), engine TP and count, rank -> role maps
    rules.py     the layout's checks as small rule functions, each naming its key
    dist_env.py  rank, world and master address from torchrun's or Slurm's environment
    schedule.py  which batch each step draws and trains, and when a publication is due (k-step async)
"""
