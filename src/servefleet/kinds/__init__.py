"""The registry of kinds: one package per recipe family (the hardware that serves its recipes
is a platform's, :mod:`servefleet.platforms`).

+ :mod:`~servefleet.kinds.rbln`: RBLN recipe cards (bare JSON or the published page text),
  named ``rbln/<name>`` (``<recipes>/rbln/<name>.json``), served on RBLN NPU hosts
+ :mod:`~servefleet.kinds.vllm`: vLLM's recipes, YAML named ``vllm/<org>/<name>``
  (``<recipes>/vllm/models/<org>/<name>.yaml``) or the recipes site's JSON form by path, served
  on GPU hosts (NVIDIA, AMD)

The registry: :func:`detect` (the kind of a file, from its content), :func:`find` (a path or a
qualified name -> its kind and file), :func:`list_recipes` (every qualified name),
:func:`kind_named` (a spec's kind) and :func:`kind_of` (the kind of the recipe data names).
:func:`register` adds a kind from outside this package (a platform of its own, a test's), and
:func:`unregister` takes it out again; :func:`default_kind` is the one whose defaults a host
takes when its data names no recipe; :func:`deploy_env` the variables the platforms' units set
themselves; :func:`platform_of` a host's platform and devices, from its recipe and its probe;
:func:`family_keys` the data keys each family reads of its own.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from servefleet import platforms
from servefleet.base.errors import RecipeError
from servefleet.base.shipped import RECIPES_DIR
from servefleet.kinds.base import Hardware, Kind, Wants
from servefleet.kinds.loader import read_recipe_text
from servefleet.kinds.rbln.card import Card, load_card
from servefleet.kinds.rbln.kind import KIND as RBLN
from servefleet.kinds.vllm.kind import KIND as VLLM
from servefleet.platforms.base import Platform

# In the order files are tried: a card first, then the registered kinds, then a vLLM recipe
# (YAML or the site's JSON: the last, it takes any file its loader can read). The first is the
# default kind (its defaults name the default recipe).
KINDS: list[Kind] = [RBLN, VLLM]
_BUILT_IN = (RBLN, VLLM)

__all__ = [
    "KINDS",
    "RECIPES_DIR",
    "Hardware",
    "Kind",
    "Wants",
    "detect",
    "find",
    "detect_kind",
    "find_recipe",
    "kind_named",
    "kind_of",
    "list_recipes",
    "load_rbln",
    "default_kind",
    "deploy_env",
    "family_keys",
    "platform_of",
    "platforms_of",
    "register",
    "unregister",
]


def register(kind: Kind) -> None:
    """Add a kind to the registry: its recipes are found (tried before vLLM's), planned and
    deployed as the built-in kinds' are, and ``servefleet resolve`` made after this takes its
    options. RecipeError when its name or one of its options is another kind's.

    + kind: the kind's one instance
    """
    flags = {o.flag: k.kind for k in KINDS for o in k.options}
    taken = [o.flag for o in kind.options if o.flag in flags]
    named = any(k.kind == kind.kind for k in KINDS)
    if named or taken:
        what = "the name is taken" if named else f"option {taken[0]} is {flags[taken[0]]}'s"
        raise RecipeError(
            f"kind {kind.kind!r} cannot be registered: {what}; allowed: a kind name and "
            f"options no registered kind has (kinds: {', '.join(k.kind for k in KINDS)})"
        )
    KINDS.insert(KINDS.index(VLLM), kind)


def unregister(kind: Kind) -> None:
    """Take a kind :func:`register` added out of the registry (the built-in ones stay).

    + kind: the kind's instance, as registered
    """
    if kind in _BUILT_IN:
        raise RecipeError(f"kind {kind.kind!r} is built in; allowed: a kind register() added")
    if kind in KINDS:
        KINDS.remove(kind)


def default_kind() -> Kind:
    """The kind whose defaults a host takes when its data names no recipe (the first)."""
    return KINDS[0]


def deploy_env() -> dict[str, str]:
    """The variables a registered platform's units set themselves (``Platform.deploy_env``) ->
    what decides them: a host's ``serve_extra_env`` sets none of them, whatever its platform."""
    return platforms.deploy_env()


def platforms_of(kind: Kind) -> list[Platform]:
    """The platforms that serve a family's recipes, in the order the probe tries them.

    + kind: the recipe family
    """
    return platforms.serving(kind.kind, kind.platforms)


def platform_of(kind: Kind, probe: dict[str, object]) -> tuple[Platform, Hardware]:
    """A host's platform and its devices: among those that serve the family's recipes, the one
    whose devices the host's probe shows (:func:`servefleet.platforms.detect`).

    + kind: the family of the host's recipe
    + probe: the output of the probe on the host
    """
    return platforms.detect(platforms_of(kind), probe)


def family_keys() -> dict[str, list[Kind]]:
    """Every data key a registered family reads of its own -> the families that read it."""
    out: dict[str, list[Kind]] = {}
    for kind in KINDS:
        for key in sorted(kind.keys):
            out.setdefault(key, []).append(kind)
    return out


def detect(path: Path) -> Kind:
    """The kind of a recipe file, from its content (a vLLM recipe when nothing else).

    + path: the recipe file
    """
    text = read_recipe_text(path, str(path))
    return next(k for k in KINDS if k.detect(path, text))


def find(name_or_path: str, recipes_dir: Path | None = None) -> tuple[Kind, Path]:
    """Locate a recipe: an existing file path (its kind detected from its content), or a
    qualified name under the recipes directory.

    + name_or_path: a file path or a qualified name (``rbln/<name>``, ``vllm/<org>/<name>``)
    + recipes_dir: the recipes directory (default :data:`RECIPES_DIR`)
    """
    base = recipes_dir or RECIPES_DIR
    p = Path(name_or_path)
    if p.is_file():
        return detect(p), p
    kind, _, rest = name_or_path.partition("/")
    for k in KINDS:
        path = k.locate(rest, base) if k.kind == kind and rest else None
        if path is not None:
            return k, path
    # one short line (#50): the closest names and where every one is listed, not the
    # installed package's path nor every name
    close = difflib.get_close_matches(name_or_path, list_recipes(base), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    lister = "servefleet recipes list" + ("" if base == RECIPES_DIR else " DIRECTORY")
    raise RecipeError(
        f"no recipe {name_or_path!r}; {hint}allowed: a recipe file or a name `{lister}` prints"
    )


def list_recipes(recipes_dir: Path | None = None) -> list[str]:
    """Qualified names of the recipes under a directory, each kind's sorted, in registry order
    (``rbln/...`` then ``vllm/...``).

    + recipes_dir: the recipes directory (default :data:`RECIPES_DIR`)
    """
    base = Path(recipes_dir or RECIPES_DIR)
    return [name for k in KINDS for name in k.names(base)]


def kind_named(kind: str) -> Kind:
    """The kind of a spec (``rbln`` cards, ``vllm`` recipes).

    + kind: a spec's ``kind``
    """
    by_kind = {k.kind: k for k in KINDS}
    if kind not in by_kind:
        raise RecipeError(f"no platform serves {kind} recipes (platforms: {', '.join(by_kind)})")
    return by_kind[kind]


def kind_of(recipe: str) -> Kind:
    """The kind of the recipe ``serve_recipe`` names.

    + recipe: a recipe name or path
    """
    return find(recipe)[0]


def detect_kind(path: Path) -> str:
    """``rbln`` for an RBLN card (bare JSON or page text), else ``vllm`` (YAML/JSON recipe).

    + path: the recipe file
    """
    return detect(path).kind


def find_recipe(name_or_path: str, recipes_dir: Path | None = None) -> tuple[str, Path]:
    """Locate a recipe (:func:`find`): the name of its kind and its file.

    + name_or_path: a file path or a qualified name
    + recipes_dir: the recipes directory (default: the shipped recipes)
    """
    kind, path = find(name_or_path, recipes_dir)
    return kind.kind, path


def load_rbln(name_or_path: str, recipes_dir: Path | None = None) -> Card:
    """Find and load an RBLN card by qualified name or path.

    + name_or_path: ``rbln/<name>`` or a file path
    + recipes_dir: the recipes directory (default: the shipped recipes)
    """
    kind, path = find(name_or_path, recipes_dir)
    if kind is not RBLN:
        raise RecipeError(f"{name_or_path}: not an RBLN recipe card (it is a {kind.kind} recipe)")
    return load_card(path, name=name_or_path)
