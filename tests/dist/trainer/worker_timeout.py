"""Single-process worker: a run started from the tiny recipe with cluster.dist_timeout_s set; writes every
group's timeout to RUN_DIR/timeouts.json.

  python worker_timeout.py RUN_DIR TIMEOUT_S
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from megatron_rl.config.load import load_recipe
from megatron_rl.run import resolve
from megatron_rl.loop.record.start import start_run


def _timeout_s(group) -> float:
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def main() -> None:
    run_dir, timeout = sys.argv[1], sys.argv[2]
    recipe = load_recipe(
        "grpo_tiny_cpu",
        [
            f"cluster.dist_timeout_s={timeout}",
            "layout.tp=1",
            "logger.wandb=false",
            f"logger.run_dir={run_dir}",
        ],
    )
    procs, _ = start_run(resolve(recipe))  # the run resolved once (run/resolve.py)
    from megatron.core import parallel_state as ps

    out = {
        "default": _timeout_s(dist.distributed_c10d._get_default_group()),
        "cpu_group": _timeout_s(procs.cpu_group),
        "tensor_parallel": _timeout_s(ps.get_tensor_model_parallel_group()),
        "data_parallel": _timeout_s(ps.get_data_parallel_group()),
    }
    (Path(run_dir) / "timeouts.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
