"""`megatron-rl` command line: one subcommand per tool, each imported only when it runs.

Lazy imports keep `megatron-rl --help` and the light commands (show, validate, plan, score) free of
torch and megatron-core start-up cost.
"""

from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("megatron_rl.cli.launch_local:main", "run a recipe on this machine (torchrun, sized from it)"),
    "train": ("megatron_rl.train:main", "the driver, one process per rank (under torchrun or srun)"),
    "show": ("megatron_rl.cli.recipes:show", "print a recipe resolved, with overrides"),
    "validate": ("megatron_rl.cli.recipes:validate", "check a recipe without a GPU"),
    "cp": ("megatron_rl.cli.recipes:cp", "copy a recipe to a folder for editing"),
    "list": ("megatron_rl.cli.recipes:list_recipes", "list the shipped recipes"),
    "plan": ("megatron_rl.cli.plan:main", "size a run before renting GPUs"),
    "report": ("megatron_rl.cli.report:main", "where a finished run's time and memory went"),
    "reshard-plan": ("megatron_rl.cli.reshard:main", "print the weight-publication plan of a recipe"),
    "score": (
        "megatron_rl.cli.score:main",
        "score completions against their problems' tests (one, or a file of them)",
    ),
    "reward-server": (
        "megatron_rl.cli.reward_server:main",
        "serve this node's sandboxes to a training job over HTTP (the reward fleet)",
    ),
    "submit": ("megatron_rl.cli.submit:main", "render and submit the sbatch command for a recipe"),
    "export": ("megatron_rl.cli.export:main", "a checkpoint's policy as an HF safetensors folder"),
    "ckpt": ("megatron_rl.cli.ckpt:main", "check checkpoints against their manifests (ckpt verify)"),
    "doctor": (
        "megatron_rl.cli.doctor:main",
        "check the versions a run needs to agree (torch, CUDA, TE, vLLM)",
    ),
    "preflight": (
        "megatron_rl.cli.preflight:main",
        "measure each node (matmul, memory, NVML, all-reduce) against the recipe's cluster figures",
    ),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: megatron-rl COMMAND [args]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"megatron-rl: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
