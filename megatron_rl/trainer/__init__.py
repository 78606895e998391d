"""The megatron-core trainer: the policy (model, optimizer, teacher-forced log-probs, the train step),
its process groups (and a second model's at its own layout: model_groups.py), the frozen reference, PPO's
critic and a reward model (value.py), HF import, the whole model gathered from its shards (gather.py),
routing replay, the device guard and the CPU patches (applied explicitly, only without CUDA)."""
