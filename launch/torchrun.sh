#!/usr/bin/env bash
# Launch a recipe on this machine with torchrun, one process per rank of the recipe's layout, through
# the same bootstrap as slurm/train.sbatch (launch/bootstrap.sh, then launch/rank.py per rank).
#
#   launch/torchrun.sh RECIPE [key=value ...]
#   launch/torchrun.sh grpo_qwen2.5-7b_1n8g rollout.temperature=0.8     # 8 processes: its layout's ranks
#   MEGATRON_RL_ENTRY=launch/check_dist.py launch/torchrun.sh grpo_tiny_cpu    # check the launch only
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 RECIPE [key=value ...]" >&2; exit 2; }
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bootstrap.sh"

# As many processes as the layout has ranks (NPROC overrides); a recipe that does not load stops here.
NPROC=${NPROC:-$("$PYTHON" -c '
import sys
from megatron_rl.config.load import load_recipe
from megatron_rl.parallel.layout import ParallelLayout
try:
    print(ParallelLayout.from_config(load_recipe(sys.argv[1], sys.argv[2:]).layout).world_size)
except Exception as e:
    sys.exit(f"launch/torchrun.sh: {e}")' "$@")}
# --standalone: a private rendezvous on a free local port, so two local runs do not collide.
exec "$PYTHON" "$MEGATRON_RL_HOME/launch/torchrun_agent.py" --standalone --nproc-per-node="$NPROC" \
  "$MEGATRON_RL_HOME/launch/rank.py" "$MEGATRON_RL_ENTRY" "$@"
