"""Relative paths a recipe file writes are read from the recipe file's folder.

A recipe names files: the model's checkpoint, the problem set, where checkpoints and run outputs go, a
checkpoint to resume from. Read from the working directory, a relative one would name another file for
every directory the command runs from (and under Slurm, the submit directory). The rule, in order:
1. A relative path the recipe file sets, or a group file in the recipe's own folder that its defaults
   (or a group choice on the command line) pick (`mine/data/mbpp.yaml` for `override /data: mbpp`), is
   read from the recipe file's folder: the copy and the data beside it go together.
2. A path given on the command line (`data.source=mine.jsonl`) is read from the directory the command
   runs in, as any path typed in a shell; it is kept as typed.
3. The shipped groups' defaults (`outputs`, `checkpoints`, the CPU fixtures' `.cache/megatron-rl/...`)
   are read from the working directory too: the demos run from the checkout's root and write there.
Names that are not paths (`bundled`, `synthetic`, `auto`, `none`), absolute paths, `~` paths and empty
values are kept as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from megatron_rl.config.schema import GROUPS

# The keys that hold paths, and the names each takes that are not paths.
PATH_KEYS: dict[str, tuple[str, ...]] = {
    "model.hf_checkpoint": (),
    "data.source": ("bundled", "synthetic"),
    "checkpoint.dir": (),
    "checkpoint.resume": ("auto", "none"),
    "logger.run_dir": (),
}


def anchor_paths(recipe, recipe_file: Path, overrides: list[str]) -> list[str]:
    """Rewrite, in place, each relative path the recipe file sets (rule 1) as a path under its folder;
    return the keys rewritten."""
    done = []
    for key in sorted(_set_by_recipe(recipe_file, overrides)):
        group, leaf = key.split(".")
        value = getattr(getattr(recipe, group), leaf)
        if not isinstance(value, str) or not value.strip() or value in PATH_KEYS[key]:
            continue
        if os.path.isabs(value) or value.startswith("~"):
            continue
        setattr(getattr(recipe, group), leaf, os.path.normpath(recipe_file.parent / value))
        done.append(key)
    return done


def _set_by_recipe(recipe_file: Path, overrides: list[str]) -> set[str]:
    """The path keys whose value comes from the recipe file or a group file in its folder, not from the
    command line (whose value wins) nor from the shipped groups."""
    body = _mapping(recipe_file)
    choices = _group_choices(body.get("defaults"))
    on_line = set()
    for override in overrides:
        key, sep, value = override.partition("=")
        key = key.lstrip("+~")
        if sep and key in GROUPS:  # `data=mbpp`: a group option, maybe from the recipe's folder
            choices[key] = value
        on_line.add(key)
    found = set()
    for key in PATH_KEYS:
        group, leaf = key.split(".")
        if key in on_line:
            continue
        own = body.get(group)
        option = choices.get(group)
        beside = recipe_file.parent / group / f"{option}.yaml" if isinstance(option, str) else None
        if isinstance(own, dict) and leaf in own:
            found.add(key)
        elif beside is not None and beside.is_file() and leaf in _mapping(beside):
            found.add(key)
    return found


def _group_choices(defaults) -> dict[str, str]:
    """{group: option} from a defaults list (`- override /data: mbpp`, `- /model: x`, `- data: y`)."""
    out: dict[str, str] = {}
    for entry in defaults if isinstance(defaults, list) else []:
        if isinstance(entry, dict) and len(entry) == 1:
            ((name, option),) = entry.items()
            group = str(name).removeprefix("override").strip().lstrip("/").split("@")[0]
            if group in GROUPS and isinstance(option, str):
                out[group] = option
    return out


def _mapping(path: Path) -> dict:
    """A YAML file's top-level mapping ({} when it holds none); the recipe loader has bounded its size."""
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(errors="replace"))
    except (OSError, yaml.YAMLError, RecursionError):
        return {}  # Hydra reads the same file and reports what is wrong with it
    return loaded if isinstance(loaded, dict) else {}
