"""The pieces of one GRPO step that need more than one component; `train.py` strings them together.

placement/  where things run and how the device and the weights move between trainer and engines:
            the process groups and pools, the feed (colocated or separated), time-sharing, the
            engine ranks' loop, the publication's refusal policy and its log-prob probe
step/       the step's own pieces: building the collaborators, collecting and scoring a batch,
            partial rollouts' carry, batch bookkeeping and the loss
record/     the run's records: its name and directory, the console, phase timing, step metrics
"""
