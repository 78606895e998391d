"""Reshard: the trainer's shards (any TP x PP, DP replicas) into the engines' layout, in memory.

    convert.py   both sides as runs of HF rows: megatron shards, vLLM per-rank tensors, whole HF
                 tensors for the loader; the inverse; fused groups for `reload_weights`
    plan.py      pure: who sends which rows to whom, op per tensor, bytes per link, lower bound, buckets
    transfer.py  local copies, bucketed point-to-point messages (NCCL / gloo), senders' digests
    checksum.py  digests of tensor bytes (xxh3, sha256, mix128 in torch ops) with the NaN/Inf check fused in
    manifest.py  per-version manifest (shape, dtype, checksum, step) and validation of a staged version
    publish.py   Publisher (stage -> validate -> activate on every rank), EngineSink contract, InMemorySink
    faults.py    conversion faults injected on purpose (tests, benchmarks/agreement.py)
`megatron-rl reshard-plan RECIPE` is megatron_rl/cli/reshard.py.

Importing this package loads neither torch.distributed nor megatron-core; the modules load torch.
"""
