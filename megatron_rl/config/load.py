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


class RecipeNotFound(FileNotFoundError):
    pass


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


def compose_recipe(name_or_path: str, overrides: list[str] | None = None):
    """Compose a recipe into an OmegaConf DictConfig typed by `RecipeConfig`.

    Unknown keys and wrong types raise here, with the full key path in the message.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from megatron_rl.config.schema import register_configs

    path = resolve_recipe(name_or_path)
    register_configs()
    GlobalHydra.instance().clear()
    searchpath = f"hydra.searchpath=[file://{CONF_DIR}]"
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base="1.3"):
            cfg = compose(config_name=path.stem, overrides=[searchpath, *(overrides or [])])
    finally:
        GlobalHydra.instance().clear()
    return cfg


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> RecipeConfig:
    """Compose a recipe and return it as a `RecipeConfig` dataclass instance (not yet validated)."""
    from omegaconf import OmegaConf

    cfg = compose_recipe(name_or_path, overrides)
    _refuse_unknown_keys(cfg, RecipeConfig, "")
    return OmegaConf.to_object(cfg)


def _refuse_unknown_keys(node, schema: type, prefix: str) -> None:
    """Hydra's `+key=value` adds keys even to structured configs; refuse any key the schema lacks."""
    import dataclasses

    from omegaconf import DictConfig

    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in fields:
            raise KeyError(f"unknown config key {path!r}; valid keys here: {', '.join(fields)}")
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
