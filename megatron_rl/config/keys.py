"""The recipe schema's keys by their dotted names: which exist, which are open mappings, which is meant.

Two things a user types on the command line meet Hydra's struct mode, which refuses any key a config
does not already hold:
- an entry of an open mapping (`data.columns.prompt=text`): the mapping's entries are the user's to
  name, so `as_mapping_entries` turns such an override into Hydra's add-or-replace form
  (`++data.columns.prompt=text`) and the key works as documented, with or without the `+`;
- a mistyped key (`optim.lrr=1`, `optim.minibatches=2`): `nearest` names the keys it probably meant,
  by spelling within the group and by the same last name in another group.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from functools import cache

from megatron_rl.config.schema import RecipeConfig


@cache
def _walk() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every key's dotted name, groups included; the dotted names of the dict-typed keys)."""
    keys, mappings = [], []

    def visit(schema: type, prefix: str) -> None:
        for name, kind in typing.get_type_hints(schema).items():
            path = f"{prefix}{name}"
            keys.append(path)
            if dataclasses.is_dataclass(kind):
                visit(kind, path + ".")
            elif typing.get_origin(kind) is dict:
                mappings.append(path)

    visit(RecipeConfig, "")
    return tuple(keys), tuple(mappings)


def schema_keys() -> tuple[str, ...]:
    """Every key of a recipe by its dotted name (`optim`, `optim.lr`, ...)."""
    return _walk()[0]


def open_mappings() -> tuple[str, ...]:
    """The keys whose value is a mapping the user names the entries of (`data.columns`)."""
    return _walk()[1]


def as_mapping_entries(overrides: list[str]) -> list[str]:
    """Overrides of an open mapping or its entries (`data.columns.prompt=text`, `+data.columns...`) in
    Hydra's add-or-replace form (`++`): struct mode refuses a new entry otherwise ("Key 'prompt' is not
    in struct"), and `+` alone refuses one the recipe already sets. Any other override is kept as is."""
    out = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        bare = key[1:] if key.startswith("+") and not key.startswith("++") else key
        if sep and any(bare == m or bare.startswith(m + ".") for m in open_mappings()):
            out.append("++" + bare + override[len(key) :])
        else:
            out.append(override)
    return out


def nearest(key: str, limit: int = 3) -> list[str]:
    """The schema keys `key` (a dotted name the schema lacks) most probably means: the keys of the same
    last name in other groups first (`optim.minibatches` -> `algorithm.minibatches`), then the closest
    spellings (`optim.lrr` -> `optim.lr`, `rollouts` -> `rollout`)."""
    keys = schema_keys()
    depth, leaf = key.count("."), key.rsplit(".", 1)[-1]
    moved = [k for k in keys if k != key and k.rsplit(".", 1)[-1] == leaf]
    peers = [k for k in keys if k.count(".") == depth]
    spelled = difflib.get_close_matches(key, peers, n=limit, cutoff=0.75)
    if not spelled and depth:  # a name too short to compare whole (`optim.lrr`): its last part, in its group
        group = key.rsplit(".", 1)[0] + "."
        leaves = [k[len(group) :] for k in peers if k.startswith(group)]
        spelled = [group + m for m in difflib.get_close_matches(leaf, leaves, n=limit, cutoff=0.6)]
    return list(dict.fromkeys(moved + spelled))[:limit]


def did_you_mean(key: str) -> str:
    """' (did you mean X or Y?)' for a key the schema lacks, '' when nothing is close."""
    close = nearest(key)
    if not close:
        return ""
    return f" (did you mean {' or '.join(close)}?)"
