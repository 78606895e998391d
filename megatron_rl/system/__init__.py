"""What this machine has and whether a recipe can run on it: torch and its CUDA build, the driver,
NCCL, transformer-engine, vLLM, megatron-core (machine.py), and the rule that a GPU cluster needs
CUDA here (device.py). `megatron-rl doctor` is megatron_rl/cli/doctor.py; whether the nodes are fit
for the run is preflight.py. When one fails: each rank's heartbeat and its end to a wait without
progress (watchdog.py), and which node the job leaves out and where the run goes on (failover.py)."""
