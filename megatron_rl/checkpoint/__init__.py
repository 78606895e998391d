"""Checkpoints: sharded model + optimizer (megatron-core dist-checkpointing) and the run's own state.

Layout of one checkpoint, `<checkpoint.dir>/<run name>/step_000012/`:
    dist/            model and optimizer, each rank writing its own shards (loadable at another layout)
    rank_00003.pt    that rank's RNG states (torch, CUDA, numpy, python)
    run_state.json   step, policy version, prompt-stream position, algorithm state
    COMPLETE         written last, after every rank has finished; a directory without it is never loaded

Pending reward work: a checkpoint is taken at a step boundary, when the reward pool is idle, so
there is none to save; a run killed mid-step redoes that step from the same prompts and seeds.
"""
