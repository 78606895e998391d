"""Install this repository into a container that brings its own torch (an NGC PyTorch image), keeping it.

    python tools/install_container.py              # inside the container, from the repository root
    python tools/install_container.py --dry-run    # what pip would install, nothing changed
    python tools/install_container.py --with-te    # also build transformer-engine, if the image has none

Why not `pip install -e '.[gpu]'`: vllm 0.33.0 pins `torch==2.14.0`, and a container's own build of that
release (`2.14.0a0+git...`) does not satisfy the pin, so pip replaces the container's torch, and the
transformer-engine, apex and flash-attn built against it break. Instead:

1. The container's torch stack is pinned as installed, in a constraints file: torch, the distributions
   torch itself requires (triton, NVIDIA libraries) and every installed distribution that requires
   torch (transformer-engine, apex, flash-attn, torchvision, ...).
2. vLLM is installed without its dependencies (`--no-deps`): its torch, torchvision, torchaudio and
   torchcodec pins name release wheels, and those packages are the container's business.
3. vLLM's other requirements and this repository (editable, no build isolation: the image's
   setuptools) are installed in one resolution under the constraints.
4. torch's version is compared before and after; any change is an error.

What it guarantees: pip neither replaces nor removes a pinned distribution. When a requirement needs
another version of one (a package pinned to torch's release wheel), pip stops with
ResolutionImpossible naming it, and nothing of that step is installed. What it does not guarantee: that
vLLM's compiled ops load against the container's torch. vLLM's wheel is built against the release, and
another build of it may differ in ABI; `megatron-rl doctor` imports `vllm._C` and says so (the fix is a
vLLM built against the container's torch, or the torch it was built for). Without torchvision /
torchaudio from the image, vLLM serves text models only (this repository's case).

Standard library only: it runs before this repository's dependencies exist. pip's own settings apply
(PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX, ...).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM = "vllm==0.33.0"
# vLLM's requirements left to the container (they pin release wheels built with torch).
CONTAINER_OWNS = {"torch", "torchvision", "torchaudio", "torchcodec"}
TE = "transformer-engine[pytorch,core_cu13]>=2.9,<2.12"  # megatron-core 0.16.1's range (pyproject gpu extra)

try:  # pip vendors packaging; a container may not have it installed on its own
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - depends on the image
    from pip._vendor.packaging.requirements import Requirement


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: md.Distribution) -> list[Requirement]:
    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def torch_stack() -> dict[str, str]:
    """The installed distributions that make up the container's torch: name -> version."""
    dists = {_norm(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}
    if "torch" not in dists:
        return {}
    stack = {"torch"}
    stack |= {_norm(r.name) for r in _requires(dists["torch"]) if _norm(r.name) in dists}
    stack |= {n for n, d in dists.items() if any(_norm(r.name) == "torch" for r in _requires(d))}
    return {n: dists[n].version for n in sorted(stack)}


def vllm_requirements(requires_dist: list[str]) -> list[str]:
    """vLLM's requirements without the container's own packages and without optional extras."""
    out = []
    for line in requires_dist:
        req = Requirement(line)
        if _norm(req.name) in CONTAINER_OWNS or (req.marker is not None and "extra" in str(req.marker)):
            continue
        out.append(line)
    return out


def _pip(args: list[str], dry_run: bool, report: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "pip", "install", *args]
    if dry_run:
        cmd += ["--dry-run", "--ignore-installed"] if "--no-deps" in args else ["--dry-run"]
    if report is not None:
        cmd += ["--report", str(report)]
    print("+ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(report.read_text()) if report is not None and report.exists() else {}


def _installs(report: dict) -> dict[str, str]:
    return {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report.get("install", [])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="resolve and report only; install nothing")
    p.add_argument("--with-te", action="store_true", help=f"build {TE} when the image has no TE")
    p.add_argument("--vllm", default=VLLM, help=f"the vLLM requirement (default {VLLM})")
    p.add_argument("--project", type=Path, default=REPO, help="the repository to install (default: this one)")
    args = p.parse_args(argv)

    kept = torch_stack()
    if not kept:
        print("install_container: no torch here; this path keeps a container's torch (elsewhere: "
              "pip install --no-build-isolation -e '.[gpu]', README GPU setup)", file=sys.stderr)  # fmt: skip
        return 2
    print("install_container: keeping " + ", ".join(f"{n} {v}" for n, v in kept.items()), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "container.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in kept.items()))
        vllm = _pip(["--no-deps", args.vllm], args.dry_run, Path(tmp) / "vllm.json")
        (entry,) = [i for i in vllm.get("install", []) if _norm(i["metadata"]["name"]) == "vllm"] or [None]
        requires = entry["metadata"].get("requires_dist", []) if entry else (md.requires("vllm") or [])
        rest = _pip(
            [
                "-c",
                str(constraints),
                "--no-build-isolation",
                "-e",
                str(args.project),
                *vllm_requirements(requires),
            ],
            args.dry_run,
            Path(tmp) / "rest.json",
        )
        changed = sorted(set(_installs(rest)) & set(kept))
        if args.with_te and not any(n.startswith("transformer-engine") for n in kept):
            te = _pip(
                ["-c", str(constraints), "--no-build-isolation", TE], args.dry_run, Path(tmp) / "te.json"
            )
            changed += sorted(set(_installs(te)) & set(kept))
    now = torch_stack()
    if changed or (not args.dry_run and now.get("torch") != kept["torch"]):
        print(f"install_container: the container's torch stack would change ({changed or now.get('torch')}); "
              "nothing should have: report this", file=sys.stderr)  # fmt: skip
        return 1
    done = "would keep" if args.dry_run else "kept"
    print(f"install_container: {done} torch {kept['torch']}; next, on a GPU node: megatron-rl doctor RECIPE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
