"""Reading vLLM recipes: the recipe YAML or the site's JSON, the shared taxonomy and strategies
of its recipes root (cached per mtime), validation of every key the resolver reads, listing."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from servefleet.errors import RecipeError
from servefleet.shipped import RECIPES_DIR
from servefleet.vllm_args import env_map, token_list
from servefleet.vllm_recipes.recipe import VllmRecipe


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _parse(path: Path, text: str) -> Any:
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise RecipeError(
                f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(f"{path}: malformed YAML{where}: {_one_line(str(problem))}") from None


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text") from None
    return _parse(path, text)


@lru_cache(maxsize=64)
def _shared(root: str, stamp: tuple[int, ...]) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """Hardware profiles, strategies and platforms of one recipes root (cached per mtime)."""
    base = Path(root)
    taxonomy = _read(base / "taxonomy.yaml")
    if not isinstance(taxonomy, dict) or not isinstance(taxonomy.get("hardware_profiles"), dict):
        raise RecipeError(f"{base / 'taxonomy.yaml'}: no hardware_profiles mapping")
    profiles = taxonomy["hardware_profiles"]
    for gpu, prof in profiles.items():
        if not isinstance(prof, dict) or not isinstance(prof.get("gpu_count"), int):
            raise RecipeError(f"{base / 'taxonomy.yaml'}: hardware profile {gpu} has no gpu_count")
    strategies: dict[str, Any] = {}
    for f in sorted((base / "strategies").glob("*.yaml")):
        s = _read(f)
        if not isinstance(s, dict):
            raise RecipeError(f"{f}: a strategy must be a mapping")
        strategies[str(s.get("name") or f.stem)] = s
    platforms: list[Any] = []
    if (base / "platforms.yaml").is_file():
        platforms = (_read(base / "platforms.yaml") or {}).get("platforms") or []
    return profiles, strategies, platforms


def _stamp(root: Path) -> tuple[int, ...]:
    files = [root / "taxonomy.yaml", root / "platforms.yaml", *(root / "strategies").glob("*.yaml")]
    return tuple(f.stat().st_mtime_ns for f in sorted(files) if f.is_file())


def _find_root(path: Path) -> Path:
    for parent in path.resolve().parents:
        if (parent / "taxonomy.yaml").is_file():
            return parent
    return RECIPES_DIR / "vllm"


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
    profiles, strategies, platforms = _shared(str(root), _stamp(root))
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
    )
    _validate(recipe)
    return recipe


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


_ARGS = ("extra_args", "args", "vllm_args")
_ENVS = ("extra_env", "env", "base_env")


def _validate_block(block: Any, where: str, overrides: bool = True) -> dict[str, Any]:
    """Check a block's argument lists, env maps and (one level of) hardware overrides."""
    b = _mapping(block, where)
    for k in _ARGS + ("base_args",):
        token_list(b.get(k), f"{where}.{k}")
    for k in _ENVS:
        env_map(b.get(k), f"{where}.{k}")
    if overrides:
        ho = f"{where}.hardware_overrides"
        for key, sub in _mapping(b.get("hardware_overrides"), ho).items():
            _validate_block(sub, f"{ho}.{key}", overrides=False)
    return b


def _validate(r: VllmRecipe) -> None:
    """Check the shape of every key the resolver reads, so resolving never meets a bad type."""
    d, n = r.data, r.name
    model = _validate_block(d.get("model"), f"{n}: model", overrides=False)
    if not isinstance(model.get("model_id"), str) or not model["model_id"]:
        raise RecipeError(f"{n}: model.model_id is missing")
    variants = _mapping(d.get("variants"), f"{n}: variants")
    if "default" not in variants:
        raise RecipeError(f"{n}: variants must include 'default' (has: {', '.join(variants)})")
    for vname, v in variants.items():
        v = _validate_block(v, f"{n}: variants.{vname}")
        if v.get("supported_hardware") is not None and not isinstance(
            v["supported_hardware"], list
        ):
            raise RecipeError(f"{n}: variants.{vname}.supported_hardware: expected a list")
    features = _mapping(d.get("features"), f"{n}: features")
    for fname, f in features.items():
        f = _validate_block(f, f"{n}: features.{fname}")
        for mname, m in _mapping(f.get("modes"), f"{n}: features.{fname}.modes").items():
            _validate_block(m, f"{n}: features.{fname}.modes.{mname}")
    opt_in = d.get("opt_in_features") or []
    if not isinstance(opt_in, list) or any(o not in features for o in opt_in):
        raise RecipeError(
            f"{n}: opt_in_features must list features of the recipe ({', '.join(features)})"
        )
    _validate_block({"hardware_overrides": d.get("hardware_overrides")}, f"{n}: recipe")
    for sname, so in _mapping(d.get("strategy_overrides"), f"{n}: strategy_overrides").items():
        _validate_block(so, f"{n}: strategy_overrides.{sname}")
    compat = d.get("compatible_strategies")
    if compat is not None and not isinstance(compat, list):
        raise RecipeError(f"{n}: compatible_strategies must be a list")
    unknown = [s for s in r.compatible_strategies if s not in r.strategies]
    if unknown:
        raise RecipeError(
            f"{n}: compatible_strategies names unknown strategies {', '.join(unknown)} "
            f"(known: {', '.join(r.strategies)})"
        )
    if not r.compatible_strategies:
        raise RecipeError(f"{n}: no compatible_strategies")
    _mapping((d.get("meta") or {}).get("hardware"), f"{n}: meta.hardware")


def list_vllm_recipes(root: Path) -> list[str]:
    """Qualified names ``vllm/<org>/<name>`` of every model YAML under a recipes directory.

    + root: ``recipes/`` or ``recipes/vllm`` (the directory holding ``models/``)
    """
    root = Path(root)
    models = root / "models" if (root / "models").is_dir() else root / "vllm" / "models"
    return [
        "vllm/" + p.relative_to(models).with_suffix("").as_posix()
        for p in sorted(models.glob("*/*.yaml"))
    ]
