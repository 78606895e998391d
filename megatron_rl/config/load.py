"""Find, compose and type-check a recipe.

A recipe is named either by a shipped name (`grpo_tiny_cpu`, looked up recursively under
`recipes/`) or by a path to a YAML file. Composition uses Hydra's compose API with the *recipe's
own folder* as the primary config directory and `conf/` behind it on the search path. That makes
an edited copy (from `megatron-rl cp`) the recipe that runs even when it keeps a shipped name:
with Hydra's `--config-dir` the user's folder would come after the shipped one and the copy would
be silently ignored.
"""

from __future__ import annotations

from pathlib import Path

from megatron_rl.config.keys import as_mapping_entries, did_you_mean
from megatron_rl.config.paths import anchor_paths
from megatron_rl.config.schema import RecipeConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
RECIPES_DIR = REPO_ROOT / "recipes"


# Bounds on what a recipe may cost to read: a recipe is a page of YAML, so anything far beyond these
# is a mistake (or a YAML alias "bomb", a few hundred bytes that expand to billions of nodes).
MAX_RECIPE_BYTES = 1 << 20
MAX_RECIPE_NODES = 100_000  # YAML nodes after expanding aliases
MAX_OVERRIDES = 1000
MAX_RECIPE_FILES = 200  # YAML files checked in a recipe's folder (its group overrides)
COMPOSE_TIMEOUT_S = 60


class RecipeNotFound(FileNotFoundError):
    pass


class RecipeError(ValueError):
    """A recipe that cannot be read or composed; the message names the file or key and the fix."""


def shipped_recipes() -> dict[str, Path]:
    """Every shipped recipe by name (file stem), found recursively."""
    found: dict[str, Path] = {}
    for path in sorted(RECIPES_DIR.rglob("*.yaml")):
        if path.stem in found:
            raise RuntimeError(f"two shipped recipes are named {path.stem!r}: {found[path.stem]} and {path}")
        found[path.stem] = path
    return found


def resolve_recipe(name_or_path: str) -> Path:
    """A path to an existing YAML file wins; otherwise a shipped recipe name."""
    p = Path(name_or_path)
    try:
        if p.suffix in (".yaml", ".yml") or p.exists():
            if p.is_file():
                return p.resolve()
            raise RecipeNotFound(f"recipe file {name_or_path} does not exist (or is not a file)")
    except OSError as e:  # a name too long for the file system, a path through a file, ...
        raise RecipeNotFound(f"recipe {name_or_path[:200]!r} is not a readable path: {e.strerror}") from None
    recipes = shipped_recipes()
    if name_or_path in recipes:
        return recipes[name_or_path]
    close = [n for n in recipes if name_or_path.lower() in n.lower()]
    hint = f" Did you mean: {', '.join(close)}?" if close else f" Shipped: {', '.join(recipes)}."
    raise RecipeNotFound(f"no recipe named {name_or_path!r}.{hint} (`megatron-rl list` shows them all)")


def check_recipe_file(path: Path, strict: bool = True) -> None:
    """Refuse, before Hydra reads it, a recipe file that is too large, not YAML, not a mapping, or whose
    aliases expand beyond MAX_RECIPE_NODES nodes. `strict=False` (a file beside the recipe, which its
    defaults may or may not use) checks only the size and the aliases."""
    import yaml

    size = path.stat().st_size
    if size > MAX_RECIPE_BYTES:
        if not strict:
            return  # Hydra reads it only if a defaults list names it, and then it fails there
        raise RecipeError(f"recipe file {path} is {size} bytes; a recipe is at most {MAX_RECIPE_BYTES} bytes")
    text = path.read_text(errors="replace")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as e:  # RecursionError: nesting beyond the stack
        if not strict:
            return
        what = "nests too deeply to read" if isinstance(e, RecursionError) else f"is not valid YAML: {e}"
        raise RecipeError(f"recipe file {path} {what}") from None
    if not strict:
        if root is not None and _expanded_size(root) > MAX_RECIPE_NODES:
            raise RecipeError(
                f"{path}, beside the recipe, expands to more than {MAX_RECIPE_NODES} YAML nodes through its "
                "aliases (&anchor / *alias); write the values out or move it away"
            )
        return
    if root is None or (isinstance(root, yaml.MappingNode) and not root.value):
        raise RecipeError(
            f"recipe file {path} is empty; a recipe starts from the defaults and names itself, e.g.\n"
            "  defaults:\n    - /base\n    - _self_\n  name: my_recipe\n(`megatron-rl cp grpo_tiny_cpu DIR` copies one to edit)"
        )
    if not isinstance(root, yaml.MappingNode):
        raise RecipeError(f"recipe file {path} must hold a YAML mapping (key: value lines), not a {root.tag}")
    if _expanded_size(root) > MAX_RECIPE_NODES:
        raise RecipeError(
            f"recipe file {path} expands to more than {MAX_RECIPE_NODES} YAML nodes through its aliases "
            "(&anchor / *alias); write the values out"
        )


_NOISE = ("full_key:", "reference_type=", "object_type=", "To append to your config", "provider=", "path=")


def _expanded_size(root) -> int:
    """Nodes of a YAML graph once its aliases are expanded, without expanding them: aliases share
    nodes, so each node's size is computed once (iteratively: no recursion limit to hit)."""
    import yaml

    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being sized: meeting one again is a cycle
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if not children_done and id(node) in open_:
            raise RecipeError("the recipe holds a recursive YAML alias (an anchor used inside itself)")
        if isinstance(node, yaml.MappingNode):
            kids = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        else:
            kids = []
        if children_done or not kids:
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            open_.discard(id(node))
        else:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def describe_error(e: BaseException) -> str:
    """Hydra's message and the causes under it ("Error merging override" alone names no reason), without
    OmegaConf's bookkeeping lines (full_key, reference_type), templated copies ($VALUE), Hydra's advice to
    add keys with `+` (the schema refuses them) or its search path listing."""
    parts: list[str] = []
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for line in str(e).splitlines():
            text = line.strip().rstrip(":")
            if text.startswith("Config search path"):
                break
            if text and "$VALUE" not in text and not text.startswith(_NOISE) and text not in parts:
                parts.append(text)
        e = e.__cause__ or e.__context__
    return "; ".join(parts) if parts else "unknown error"


def _unknown_key(e: BaseException) -> str | None:
    """The dotted key an OmegaConf error says the schema lacks ("Key 'lrr' not in 'OptimConfig'", "... is
    not in struct"), from its `full_key`; None for any other error."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        full_key = getattr(e, "full_key", None)
        if full_key and (" not in '" in str(e) or "is not in struct" in str(e)):
            return str(full_key)
        e = e.__cause__ or e.__context__
    return None


def compose_recipe(name_or_path: str, overrides: list[str] | None = None):
    """Compose a recipe into an OmegaConf DictConfig typed by `RecipeConfig`.

    Unknown keys and wrong types raise here (RecipeError), with the full key path in the message.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from megatron_rl.config.schema import register_configs

    path = resolve_recipe(name_or_path)
    overrides = list(overrides or [])
    if len(overrides) > MAX_OVERRIDES or any(len(o) > 10_000 for o in overrides):
        raise RecipeError(f"at most {MAX_OVERRIDES} overrides of at most 10000 characters each")
    overrides = as_mapping_entries(overrides)  # data.columns.prompt=text adds the entry, no `+` needed
    # The recipe and every YAML beside it that its defaults may pull in (a folder of group overrides):
    # a bomb in a sibling file would otherwise go through Hydra unchecked.
    # Only their size and aliases: an unrelated YAML beside a recipe may be anything else.
    check_recipe_file(path)
    near = [*path.parent.glob("*.y*ml"), *path.parent.glob("*/*.y*ml")]
    for f in sorted(p for p in near if p.is_file() and p != path)[:MAX_RECIPE_FILES]:
        check_recipe_file(f, strict=False)
    register_configs()
    GlobalHydra.instance().clear()
    searchpath = f"hydra.searchpath=[file://{CONF_DIR}]"
    try:
        with _time_limit(COMPOSE_TIMEOUT_S, f"composing recipe {path}"):
            with initialize_config_dir(config_dir=str(path.parent), version_base="1.3"):
                cfg = compose(config_name=path.stem, overrides=[searchpath, *overrides])
    except Exception as e:  # Hydra / OmegaConf: a bad override, key, type or defaults entry
        unknown = _unknown_key(e)
        hint = did_you_mean(unknown) if unknown else ""
        raise RecipeError(f"recipe {name_or_path!r} does not compose: {describe_error(e)}{hint}") from e
    finally:
        GlobalHydra.instance().clear()
    return cfg


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> RecipeConfig:
    """Compose a recipe and return it as a `RecipeConfig` dataclass instance (not yet checked: that is
    megatron_rl/check/recipe.py), the relative paths its file writes read from its folder
    (config/paths.py)."""
    from omegaconf import OmegaConf

    cfg = compose_recipe(name_or_path, overrides)
    if OmegaConf.get_type(cfg) is not RecipeConfig:
        raise RecipeError(
            f"recipe {name_or_path!r} does not start from the defaults; begin it with\n"
            "  defaults:\n    - /base\n    - _self_"
        )
    _refuse_unknown_keys(cfg, RecipeConfig, "")
    try:
        # Interpolations resolve here, and chains of them can take as long as a bomb: bounded too.
        with _time_limit(COMPOSE_TIMEOUT_S, f"resolving recipe {name_or_path!r}"):
            recipe = OmegaConf.to_object(cfg)
    except RecipeError:
        raise
    except Exception as e:  # a required value left unset (???), or one that does not convert
        raise RecipeError(f"recipe {name_or_path!r}: {describe_error(e)}") from e
    anchor_paths(recipe, resolve_recipe(name_or_path), list(overrides or []))  # config/paths.py's rule
    return recipe


class _time_limit:
    """Raise RecipeError when the block runs longer than `seconds` (main thread only; elsewhere a no-op)."""

    def __init__(self, seconds: int, what: str):
        self.seconds, self.what, self.armed = seconds, what, False

    def _expired(self, signum, frame):
        raise RecipeError(f"{self.what} took more than {self.seconds} s; is the recipe unusually large?")

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
            import time

            self.outer = signal.alarm(0)  # an outer timer's remaining seconds (0: none), restored on exit
            self.started = time.monotonic()
            self.previous = signal.signal(signal.SIGALRM, self._expired)
            signal.alarm(min(self.seconds, self.outer) if self.outer else self.seconds)
            self.armed = True
        return self

    def __exit__(self, *exc):
        import signal

        if self.armed:
            import time

            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.previous)
            if self.outer:
                signal.alarm(max(1, round(self.outer - (time.monotonic() - self.started))))
        return False


def _refuse_unknown_keys(node, schema: type, prefix: str) -> None:
    """Hydra's `+key=value` adds keys even to structured configs; refuse any key the schema lacks."""
    import dataclasses

    from omegaconf import DictConfig

    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in fields:
            raise RecipeError(
                f"unknown config key {path!r}{did_you_mean(path)}; valid keys here: {', '.join(fields)}"
            )
        child = node._get_node(key)
        ftype = fields[key].type
        sub = ftype if isinstance(ftype, type) and dataclasses.is_dataclass(ftype) else None
        if sub is None and isinstance(ftype, str):
            from megatron_rl.config import schema as S

            sub = getattr(S, ftype, None)
            sub = sub if dataclasses.is_dataclass(sub) else None
        if sub is not None and isinstance(child, DictConfig):
            _refuse_unknown_keys(child, sub, path + ".")


def to_yaml(recipe: RecipeConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(recipe))
