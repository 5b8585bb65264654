"""Reading vLLM recipes: the recipe YAML or the site's JSON, the shared taxonomy and strategies
of its recipes root (cached per mtime), listing. The checks live in ``schema``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import RECIPES_DIR
from servefleet.kinds.loader import parse_recipe
from servefleet.kinds.vllm import schema
from servefleet.kinds.vllm.recipe import VllmRecipe


def _parse(path: Path, text: str) -> Any:
    return parse_recipe(text, str(path), json_form=path.suffix == ".json")


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text") from None
    return _parse(path, text)


@lru_cache(maxsize=64)
def _shared(
    root: str, stamp: tuple[int, ...]
) -> tuple[dict[str, Any], dict[str, Any], list[Any], dict[str, Any]]:
    """Hardware profiles, strategies, platforms and the whole taxonomy of one recipes root
    (cached per mtime), each checked (:mod:`servefleet.kinds.vllm.schema`)."""
    base = Path(root)
    taxonomy = _read(base / "taxonomy.yaml")
    schema.check_taxonomy(taxonomy, str(base / "taxonomy.yaml"))
    strategies: dict[str, Any] = {}
    for f in sorted((base / "strategies").glob("*.yaml")):
        s = _read(f)
        schema.check_strategy(s, str(f))
        strategies[str(s.get("name") or f.stem)] = s
    platforms: list[Any] = []
    if (base / "platforms.yaml").is_file():
        platforms = schema.check_platforms(
            _read(base / "platforms.yaml"), str(base / "platforms.yaml")
        )
    return taxonomy["hardware_profiles"], strategies, platforms, taxonomy


def _stamp(root: Path) -> tuple[int, ...]:
    files = [root / "taxonomy.yaml", root / "platforms.yaml", *(root / "strategies").glob("*.yaml")]
    return tuple(f.stat().st_mtime_ns for f in sorted(files) if f.is_file())


def vllm_root(base: Path) -> Path:
    """The vLLM recipes root of a recipes directory: the directory itself when it is laid out as
    the upstream collection (vllm-project/recipes: ``models/``, ``strategies/`` and
    ``taxonomy.yaml`` at its root), else its ``vllm/`` (servefleet's ``recipes/vllm``).

    + base: a recipes directory (``SERVEFLEET_RECIPES``, ``recipes list DIR``) or a vLLM root
    """
    base = Path(base)
    if (base / "taxonomy.yaml").is_file() or (base / "models").is_dir():
        return base
    return base / "vllm"


def _find_root(path: Path) -> Path:
    for parent in path.resolve().parents:
        if (parent / "taxonomy.yaml").is_file():
            return parent
    return vllm_root(RECIPES_DIR)


def _qualified_name(path: Path, root: Path) -> str:
    try:
        rel = path.resolve().relative_to(root / "models")
    except ValueError:
        return str(path)
    if path.suffix == ".yaml" and len(rel.parts) == 2:
        return "vllm/" + rel.with_suffix("").as_posix()
    return str(path)


def load_vllm_recipe(path: Path) -> VllmRecipe:
    """Load a vLLM recipe YAML or the recipes site's JSON form, with its taxonomy and strategies.

    The shared files come from the nearest parent directory holding ``taxonomy.yaml``, else
    the shipped ``recipes/vllm``.

    + path: ``models/<org>/<name>.yaml`` or a site JSON file
    """
    path = Path(path)
    data = _read(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a vLLM recipe must be a mapping, got {type(data).__name__}")
    root = _find_root(path)
    if not (root / "taxonomy.yaml").is_file():
        raise RecipeError(f"{path}: no taxonomy.yaml above it and none in {root}")
    profiles, strategies, platforms, taxonomy = _shared(str(root), _stamp(root))
    recommended = data.get("recommended_command") if path.suffix == ".json" else None
    if path.suffix == ".json" and not isinstance(recommended, dict):
        raise RecipeError(f"{path}: the JSON form has no recommended_command mapping")
    recipe = VllmRecipe(
        name=_qualified_name(path, root),
        path=path,
        form="json" if path.suffix == ".json" else "yaml",
        data=data,
        profiles=profiles,
        strategies=strategies,
        platforms=list(platforms),
        recommended=recommended,
        taxonomy=taxonomy,
    )
    if recommended is not None:
        schema.check_recommended(recommended, recipe.name)
    schema.check_recipe(data, recipe.name, strategies)
    return recipe


def list_vllm_recipes(root: Path) -> list[str]:
    """Qualified names ``vllm/<org>/<name>`` of every model YAML under a recipes directory.

    + root: ``recipes/``, ``recipes/vllm`` or a checkout of the upstream collection (the
      directory holding ``models/``, or the one above it)
    """
    models = vllm_root(root) / "models"
    return [
        "vllm/" + p.relative_to(models).with_suffix("").as_posix()
        for p in sorted(models.glob("*/*.yaml"))
    ]
