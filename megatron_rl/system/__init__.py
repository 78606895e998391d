"""What this machine has and whether a recipe can run on it: torch and its CUDA build, the driver,
NCCL, transformer-engine, vLLM, megatron-core (machine.py), and the rule that a GPU cluster needs
CUDA here (device.py). `megatron-rl doctor` is megatron_rl/cli/doctor.py."""
