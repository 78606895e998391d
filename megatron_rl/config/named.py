"""A recipe value of the form `module:name` (a reward function, an environment class) to the object it
names, with errors that say which key is wrong and how: one rule for every such key."""

from __future__ import annotations

import importlib


def is_named(spec: object) -> bool:
    """True for a well-formed "module:name" (both parts non-empty, one colon)."""
    return isinstance(spec, str) and spec.count(":") == 1 and all(spec.split(":"))


def import_named(spec: str, key: str) -> object:
    """The object "module:name" names; ImportError or AttributeError naming `key` when it is not there.
    The caller checks the form first (`is_named`): its message says what that key takes."""
    module_name, name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"{key}={spec!r}: cannot import module {module_name!r} ({e}); is it on PYTHONPATH?"
        ) from None
    obj = getattr(module, name, None)
    if obj is None:
        raise AttributeError(f"{key}={spec!r}: module {module_name!r} has no {name!r}")
    return obj
