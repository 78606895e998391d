"""One step's pieces: the collaborators built from a recipe (components.py), a batch generated and
scored (collect.py), partial rollouts' carry between batches (carry.py), and the batch's bookkeeping
and loss (rl_batch.py)."""
