# shellcheck shell=bash
# Job-wide environment shared by every launcher: `source` it (slurm/train.sbatch, launch/torchrun.sh).
#
# The per-rank half is launch/rank.py (ranks from srun's or torchrun's variables, via
# megatron_rl/parallel/dist_env.py). This half sets what is the same for every rank of a job. Every value
# yields to one already in the environment, so `export NCCL_DEBUG=INFO` before sbatch wins.

MEGATRON_RL_HOME=${MEGATRON_RL_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export MEGATRON_RL_HOME
# The ranks import megatron_rl from the checkout itself, also inside a container that only mounts it.
export PYTHONPATH="$MEGATRON_RL_HOME${PYTHONPATH:+:$PYTHONPATH}"
# What the ranks run: the trainer, or e.g. launch/check_dist.py to check a launch in seconds.
export MEGATRON_RL_ENTRY=${MEGATRON_RL_ENTRY:-megatron_rl.train}

# Interpreter: in a container its own python; on the host the repository's venv (`make venv`) if any.
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -n "${CONTAINER_IMAGE:-}" ]]; then
    PYTHON=python
  elif [[ -x "$MEGATRON_RL_HOME/.venv/bin/python" ]]; then
    PYTHON="$MEGATRON_RL_HOME/.venv/bin/python"
  else
    PYTHON=python3
  fi
fi
export PYTHON

# One OpenMP thread per rank: ranks already fill the cores, and on CPU the rollout engine runs ~15x
# slower with the default (one thread per core in every rank). torchrun sets the same default.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# NCCL and CUDA defaults (no effect on CPU runs):
#   CUDA_DEVICE_MAX_CONNECTIONS=1     megatron-core's tensor/sequence-parallel overlap relies on kernels
#                                     reaching the GPU in issue order (one hardware queue).
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=1 a failed or timed-out collective aborts the rank, so the job ends
#                                     (and srun --kill-on-bad-exit stops the rest) instead of hanging
#                                     until the time limit.
#   NCCL_DEBUG=WARN                   NCCL errors come with their cause, without INFO's per-ring lines.
#   NCCL_NVLS_ENABLE=0                NVLink SHARP buffers cost GPU memory per communicator; a colocated
#                                     job holds many (TP, DP, PP, engine groups) next to the KV cache.
# Site settings (interfaces, IB HCAs) belong in your environment or the container, e.g.
#   export NCCL_SOCKET_IFNAME=ib0 NCCL_IB_HCA=mlx5
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

if [[ -n "${SLURM_JOB_ID:-}" ]]; then
  # Rank 0 runs on the first node of the job; every node computes the same address and port.
  # The port rule is megatron_rl/parallel/dist_env.py's (_port_from_job): two jobs sharing a node differ.
  if [[ -z "${MASTER_ADDR:-}" ]]; then
    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
    MASTER_ADDR=${MASTER_ADDR:-$(hostname)} # the batch script runs on the first node
  fi
  export MASTER_ADDR
  export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
  # W&B and the run directory need nothing here: the trainer names the run <recipe>-<job id> (the
  # same after a requeue, so the run continues) and groups runs by recipe (megatron_rl/loop/record/run.py).
fi
