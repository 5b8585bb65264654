"""Recipe sources behind one registry: one module per kind of recipe file.

+ :mod:`~servefleet.sources.rbln`: RBLN recipe cards (bare JSON or the published page text),
  named ``rbln/<name>`` (``<recipes>/rbln/<name>.json``)
+ :mod:`~servefleet.sources.vllm_json`: the vLLM recipes site's JSON form of a model, by path
+ :mod:`~servefleet.sources.vllm_yaml`: vLLM recipe YAML, named ``vllm/<org>/<name>``
  (``<recipes>/vllm/models/<org>/<name>.yaml``)

The registry: :func:`detect` (the source of a file, from its content), :func:`find` (a path or a
qualified name -> its source and file), :func:`list_recipes` (every qualified name).
"""

from __future__ import annotations

from pathlib import Path

from servefleet.errors import RecipeError
from servefleet.recipes import read_recipe_text
from servefleet.shipped import RECIPES_DIR
from servefleet.sources import rbln, vllm_json, vllm_yaml
from servefleet.sources.base import Source

# In the order files are tried: a card first, then the site's JSON, then a recipe YAML
SOURCES: tuple[Source, ...] = (rbln.SOURCE, vllm_json.SOURCE, vllm_yaml.SOURCE)

__all__ = ["RECIPES_DIR", "SOURCES", "Source", "detect", "find", "list_recipes"]


def detect(path: Path) -> Source:
    """The source of a recipe file, from its content (a vLLM recipe YAML when nothing else).

    + path: the recipe file
    """
    text = read_recipe_text(path, str(path))
    return next(s for s in SOURCES if s.detect(path, text))


def find(name_or_path: str, recipes_dir: Path | None = None) -> tuple[Source, Path]:
    """Locate a recipe: an existing file path (its source detected from its content), or a
    qualified name under the recipes directory.

    + name_or_path: a file path or a qualified name (``rbln/<name>``, ``vllm/<org>/<name>``)
    + recipes_dir: the recipes directory (default :data:`RECIPES_DIR`)
    """
    base = recipes_dir or RECIPES_DIR
    p = Path(name_or_path)
    if p.is_file():
        return detect(p), p
    kind, _, rest = name_or_path.partition("/")
    for source in SOURCES:
        path = source.locate(rest, base) if source.kind == kind and rest else None
        if path is not None:
            return source, path
    known = list_recipes(base)
    hint = f"known: {', '.join(known)}" if known else f"no recipes under {base}"
    raise RecipeError(f"no recipe {name_or_path!r} (not a file, not a name under {base}; {hint})")


def list_recipes(recipes_dir: Path | None = None) -> list[str]:
    """Qualified names of the recipes under a directory, each source's sorted, in source order
    (``rbln/...`` then ``vllm/...``).

    + recipes_dir: the recipes directory (default :data:`RECIPES_DIR`)
    """
    base = Path(recipes_dir or RECIPES_DIR)
    return [name for source in SOURCES for name in source.names(base)]
