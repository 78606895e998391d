"""`megatron-rl ckpt verify DIR`: check checkpoints against their manifests before trusting them.

DIR is one checkpoint (`.../step_000012`) or a run's checkpoint folder (`<checkpoint.dir>/<run>`),
in which case every checkpoint is checked and the one `checkpoint.resume=auto` would take is named.
Exit status: 0 every checkpoint verifies, 1 at least one does not, 2 nothing to verify (bad DIR).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from megatron_rl.checkpoint.integrity import read_manifest, verify
from megatron_rl.checkpoint.store import list_checkpoints

OK, FAILED, USAGE = 0, 1, 2


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="megatron-rl ckpt", description="checkpoint tools")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check every file of checkpoints against their manifests")
    v.add_argument("dir", type=Path, help="a checkpoint (step_NNNNNN) or a run's checkpoint folder")
    v.add_argument("--quick", action="store_true", help="sizes only: do not re-read the files")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return USAGE if e.code else OK
    return verify_command(args.dir, full=not args.quick)


def verify_command(directory: Path, full: bool = True) -> int:
    if not directory.is_dir():
        print(f"megatron-rl ckpt verify: {directory} is not a directory", file=sys.stderr)
        return USAGE
    ckpts = [path for _, path in list_checkpoints(directory)]
    single = not ckpts
    if single:
        if not ((directory / "COMPLETE").exists() or (directory / "dist").is_dir()):
            print(
                f"megatron-rl ckpt verify: {directory} is neither a checkpoint (no COMPLETE, no dist/) nor a "
                "folder of step_NNNNNN checkpoints",
                file=sys.stderr,
            )
            return USAGE
        ckpts = [directory]
    newest_ok, failed = None, 0
    for path in ckpts:
        t0 = time.perf_counter()
        problems = verify(path, full=full)
        secs = time.perf_counter() - t0
        if problems:
            failed += 1
            print(f"FAIL {path}")
            for line in problems:
                print(f"     {line}")
        else:
            manifest, _ = read_manifest(path)
            n, size = len(manifest["files"]), manifest["total_bytes"]
            print(
                f"OK   {path} ({n} files, {size / 2**20:.1f} MiB, {'checksums' if full else 'sizes'}, {secs:.2f} s)"
            )
            newest_ok = path
    if not single:
        print(f"checkpoint.resume=auto would take: {newest_ok or 'none (starts from step 0)'}")
    return FAILED if failed else OK
