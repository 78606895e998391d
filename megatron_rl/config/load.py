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

from megatron_rl.config.schema import RecipeConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
RECIPES_DIR = REPO_ROOT / "recipes"


# Bounds on what a recipe may cost to read: a recipe is a page of YAML, so anything far beyond these
# is a mistake (or a YAML alias "bomb", a few hundred bytes that expand to billions of nodes).
MAX_RECIPE_BYTES = 1 << 20
MAX_RECIPE_NODES = 100_000  # YAML nodes after expanding aliases
MAX_OVERRIDES = 1000
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
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_file():
            return p.resolve()
        raise RecipeNotFound(f"recipe file {name_or_path} does not exist")
    recipes = shipped_recipes()
    if name_or_path in recipes:
        return recipes[name_or_path]
    close = [n for n in recipes if name_or_path.lower() in n.lower()]
    hint = f" Did you mean: {', '.join(close)}?" if close else f" Shipped: {', '.join(recipes)}."
    raise RecipeNotFound(f"no recipe named {name_or_path!r}.{hint} (`megatron-rl list` shows them all)")


def check_recipe_file(path: Path) -> None:
    """Refuse, before Hydra reads it, a recipe file that is too large, not YAML, not a mapping, or whose
    aliases expand beyond MAX_RECIPE_NODES nodes."""
    import yaml

    size = path.stat().st_size
    if size > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe file {path} is {size} bytes; a recipe is at most {MAX_RECIPE_BYTES} bytes")
    text = path.read_text(errors="replace")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe file {path} is not valid YAML: {e}") from None
    if root is None or (isinstance(root, yaml.MappingNode) and not root.value):
        raise RecipeError(
            f"recipe file {path} is empty; a recipe starts from the defaults and names itself, e.g.\n"
            "  defaults:\n    - /base\n    - _self_\n  name: my_recipe\n(`megatron-rl cp grpo_tiny_cpu DIR` copies one to edit)"
        )
    if not isinstance(root, yaml.MappingNode):
        raise RecipeError(f"recipe file {path} must hold a YAML mapping (key: value lines), not a {root.tag}")
    sizes: dict[int, int] = {}

    def expanded(node) -> int:  # aliases share nodes: memoised, so a bomb is counted, not expanded
        if id(node) in sizes:
            return sizes[id(node)]
        n = 1
        if isinstance(node, yaml.MappingNode):
            n += sum(expanded(k) + expanded(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n += sum(expanded(v) for v in node.value)
        sizes[id(node)] = n
        return n

    if expanded(root) > MAX_RECIPE_NODES:
        raise RecipeError(
            f"recipe file {path} expands to more than {MAX_RECIPE_NODES} YAML nodes through its aliases "
            "(&anchor / *alias); write the values out"
        )


_NOISE = ("full_key:", "reference_type=", "object_type=", "To append to your config", "provider=", "path=")


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
    check_recipe_file(path)
    register_configs()
    GlobalHydra.instance().clear()
    searchpath = f"hydra.searchpath=[file://{CONF_DIR}]"
    try:
        with _time_limit(COMPOSE_TIMEOUT_S, f"composing recipe {path}"):
            with initialize_config_dir(config_dir=str(path.parent), version_base="1.3"):
                cfg = compose(config_name=path.stem, overrides=[searchpath, *overrides])
    except RecipeError:
        raise
    except Exception as e:  # Hydra / OmegaConf: a bad override, key, type or defaults entry
        raise RecipeError(f"recipe {name_or_path!r} does not compose: {describe_error(e)}") from e
    finally:
        GlobalHydra.instance().clear()
    return cfg


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> RecipeConfig:
    """Compose a recipe and return it as a `RecipeConfig` dataclass instance (not yet checked: that is
    megatron_rl/check.py)."""
    from omegaconf import OmegaConf

    cfg = compose_recipe(name_or_path, overrides)
    if OmegaConf.get_type(cfg) is not RecipeConfig:
        raise RecipeError(
            f"recipe {name_or_path!r} does not start from the defaults; begin it with\n"
            "  defaults:\n    - /base\n    - _self_"
        )
    _refuse_unknown_keys(cfg, RecipeConfig, "")
    try:
        recipe = OmegaConf.to_object(cfg)
    except Exception as e:  # a required value left unset (???), or one that does not convert
        raise RecipeError(f"recipe {name_or_path!r}: {describe_error(e)}") from e
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
            self.previous = signal.signal(signal.SIGALRM, self._expired)
            signal.alarm(self.seconds)
            self.armed = True
        return self

    def __exit__(self, *exc):
        import signal

        if self.armed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


def _refuse_unknown_keys(node, schema: type, prefix: str) -> None:
    """Hydra's `+key=value` adds keys even to structured configs; refuse any key the schema lacks."""
    import dataclasses

    from omegaconf import DictConfig

    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in fields:
            raise RecipeError(f"unknown config key {path!r}; valid keys here: {', '.join(fields)}")
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
