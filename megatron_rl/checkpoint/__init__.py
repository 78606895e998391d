"""Checkpoints: sharded model + optimizer (megatron-core dist-checkpointing) and the run's own state.

Layout of one checkpoint, `<checkpoint.dir>/<run name>/step_000012/` (written as `step_000012.partial/`
and renamed once sealed):
    dist/            model and optimizer, each rank writing its own shards (loadable at another layout)
    rank_00003.pt    that rank's RNG states (tensors and numbers only: loaded with weights_only=True)
    run_state.json   step, policy version, prompt-stream position, algorithm state
    MANIFEST.json    every file above with its size and XXH3-128 (integrity.py), written before:
    COMPLETE         written last, after every rank has finished; a directory without it is never loaded

Pending reward work: a checkpoint is taken at a step boundary, when the reward pool is idle, so
there is none to save; a run killed mid-step redoes that step from the same prompts and seeds.
"""
