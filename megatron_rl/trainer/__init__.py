"""The megatron-core trainer: the policy (model, optimizer, teacher-forced log-probs, the train step),
its process groups, the frozen reference, HF import, routing replay, the device guard and the CPU
patches (applied explicitly, only without CUDA)."""
