"""The launcher's check, carried to the ranks: a seal of what it read.

`megatron-rl run` (launch_local) and `megatron-rl submit` check the recipe in full before any rank
starts, the problem set read through the model's tokenizer included (every prompt's length, up to
`check/files.py` MAX_PROMPTS_CHECKED). Every rank checks the recipe again, because the check resolves
the run each rank reads (run/resolve.py); but reading and tokenizing the problem set again on every
rank at once (eight ranks per node competing for its cores, each tokenizing up to 20,000 prompts)
proves nothing the launcher did not.

So the launcher passes a seal in the environment (`SEAL_ENV`): a digest of the recipe as composed, of
the files the data check read (the problem files and the model's tokenizer folder: path, size and
modification time and change time of each) and of this package's version. A rank whose own digest of the same things
equals it skips that read; any difference (another override, an edited or replaced file, a rank
started by hand with no launcher, storage that shows other times) means a full check there. A seal
can only save work: it never lets through what the check would refuse, and without one nothing changes.
It is not a security boundary (whoever sets a rank's environment runs the rank anyway).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

SEAL_ENV = "MEGATRON_RL_CHECKED"
log = logging.getLogger(__name__)


def _files(source: str) -> list[Path]:
    """The files a problem source or a checkpoint folder consists of, sorted (none for what is not there)."""
    if source in ("", "synthetic"):
        return []
    if source == "bundled":
        from megatron_rl.data.sources import BUNDLED

        return [BUNDLED]
    path = Path(source)
    if glob.has_magic(source):
        return sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.is_file() else []


def _identity(path: Path) -> list:
    """What changes when a file's contents may have: its size and modification time, which `touch -d` or
    a copy that keeps times can put back, and its change time, which no user can (any write or
    `utime` sets it to now)."""
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-rl")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return ""


def seal(cfg) -> str:
    """The digest of a composed recipe (`RecipeConfig`) and of the files its data check reads."""
    files = _files(str(cfg.data.source)) + _files(str(cfg.model.hf_checkpoint or ""))
    recipe = asdict(cfg)
    # Where the job's own reward fleet listens is added by slurm/train.sbatch after the check; it reads
    # no file the check reads (the ranks check the endpoints themselves: reward/remote.py).
    recipe["reward"]["endpoints_file"] = ""
    body = {
        "version": _version(),
        "recipe": recipe,
        "files": [_identity(p) for p in files],
    }
    text = json.dumps(body, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sealed(cfg, env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher checked exactly this recipe with exactly these files (`SEAL_ENV` holds
    their seal). False without a seal, or when anything differs."""
    env = os.environ if env is None else env
    given = env.get(SEAL_ENV, "")
    if not given:
        return False
    try:
        mine = seal(cfg)
    except OSError:  # a file vanished between listing and stat: check in full
        mine = ""
    if given != mine:
        log.warning(
            "the launcher's recipe check (%s) does not match this rank's recipe and files: checking in full "
            "here (another override, or a problem or tokenizer file that changed or looks different from "
            "this node)",
            SEAL_ENV,
        )
    return given == mine
