"""The Kind interface: what differs by recipe family, behind one seam.

A kind (:mod:`servefleet.kinds.rbln`: RBLN cards; :mod:`servefleet.kinds.vllm`: vLLM's recipes)
owns its recipes: recognising, naming, showing and resolving them, the ``servefleet resolve``
options it takes (:class:`ResolveOption`), its data keys and their defaults (shipped in its
package), how the devices a host has are checked against a recipe, and the extras a selection
needs of the release's top package. What differs by the hardware that serves them (the probe's
device commands, the devices variable, the driver, the pins and top package, the flag table,
compile and pre-warm, the first start's timeout) is the platform's
(:mod:`servefleet.platforms`): a kind names the platforms its recipes are served on
(:attr:`Kind.platforms`), and a host's platform is decided from its probe. A new recipe family is
one package here plus data, registered with :func:`servefleet.kinds.register`.

A kind reads the deploy's settings through :class:`Wants` (the attributes it uses), so it never
imports the settings layer above it. Pure: no pyinfra import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet import platforms
from servefleet.base.errors import RecipeError
from servefleet.base.remote import layout
from servefleet.base.shipped import RECIPES_DIR
from servefleet.platforms.base import Hardware, Wants
from servefleet.spec import ServeSpec

# A Hugging Face model id as every recipe names one and the host's fetcher takes it: ORG/NAME of
MODEL_ID, MODEL_ID_ALLOWED = layout.MODEL_ID, layout.MODEL_ID_ALLOWED  # the host contract's rule
# vLLM's recipes may also name a model by its local directory (an absolute path)
MODEL_PATH = re.compile(r"(?!.*\.\.)/[A-Za-z0-9._/-]+\Z")
MODEL_PATH_ALLOWED = f"{MODEL_ID_ALLOWED}, or an absolute path of [A-Za-z0-9._/-]"


def model_problem(value: Any, where: str, paths: bool = False) -> str | None:
    """Why ``value`` is not a model id (or, with ``paths``, a local model directory), or None.

    + value: the model a recipe names
    + where: how the message names it
    + paths: accept an absolute path (vLLM's recipes)
    """
    if isinstance(value, str) and (
        MODEL_ID.fullmatch(value) or (paths and MODEL_PATH.match(value))
    ):
        return None
    shown = repr(value[:80]) if isinstance(value, str) else type(value).__name__
    allowed = MODEL_PATH_ALLOWED if paths else MODEL_ID_ALLOWED
    return f"{where}: {shown} is not a model id; allowed: {allowed}"


# The words each kind's servers may start with, before the model: an allow-list, as the flag
# table is (a launcher of any bare word resolved, and only the host's pre-flight stopped it)
LAUNCHERS = {"rbln": ("vllm serve",), "vllm": ("vllm serve", "vllm-omni serve")}


def launcher_problem(value: Any, where: str, kind: str) -> str | None:
    """Why ``value`` is not a launcher of ``kind`` (:data:`LAUNCHERS`), or None.

    + value: the launcher the recipe names (``vllm serve``)
    + where: how the message names it
    + kind: ``rbln`` or ``vllm``
    """
    allowed = LAUNCHERS[kind]
    if isinstance(value, str) and " ".join(value.split()) in allowed:
        return None
    shown = repr(value[:80]) if isinstance(value, str) else type(value).__name__
    return (
        f"{where}: {shown} is not a launcher servefleet runs; allowed: "
        f"{' or '.join(repr(a) for a in allowed)}"
    )


def draft_model(config: Any, paths: bool = False) -> str | None:
    """The draft model a ``--speculative-config`` object names (None when it names none);
    RecipeError when its ``model`` is not a model id.

    + config: the flag's decoded JSON
    + paths: accept a local model directory (vLLM's recipes)
    """
    draft = config.get("model") if isinstance(config, dict) else None
    if draft is None:
        return None
    problem = model_problem(draft, "--speculative-config: draft model", paths)
    if problem:
        raise RecipeError(problem)
    return str(draft)


@dataclass(frozen=True)
class ResolveOption:
    """One option of ``servefleet resolve`` that a kind takes (the CLI builds its click option
    from it, its help prefixed with the kind's :attr:`Kind.title`).

    + flag: the option (``--target``)
    + key: the keyword :meth:`Kind.resolve` reads its value under (``target``)
    + help: its one-line help
    + metavar: how the help names its value (``AXIS=VALUE``), None for the type's own
    + type: ``str`` or ``int``, what its value is read as
    + multiple: it may be given more than once (a tuple of values)
    + is_flag: a switch, without a value
    """

    flag: str
    key: str
    help: str
    metavar: str | None = None
    type: type = str
    multiple: bool = False
    is_flag: bool = False


class Kind:
    """The interface each recipe family implements (one instance, ``KIND``).

    Recipes:
    + kind: the first part of its qualified names (``rbln/...``, ``vllm/...``) and the spec's kind
    + label: how errors name a recipe of this kind (``an RBLN recipe card``)
    + title: how help and docs name it (``RBLN``, ``vLLM``)
    + options: the ``servefleet resolve`` options it takes (:class:`ResolveOption`)

    Hosts:
    + platforms: the hardware platforms that serve its recipes (``servefleet.platforms``), in
      the order the probe tries them: a host's is the one whose devices its probe shows, and
      the first is the one ``servefleet resolve`` renders a unit for
    + defaults: data key -> this family's default, shipped in its package (``defaults.py``):
      over the key table's platform-neutral ones, for a host whose data does not set the key
      (the first kind's are every host's when its data names no recipe); they hold its
      platforms' defaults too (their pins and indexes, the RBLN driver's)
    + keys: the data keys it reads of its own (its selection's), refused on a host of another
      family
    """

    kind = ""
    label = ""
    title = ""
    options: tuple[ResolveOption, ...] = ()
    platforms: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = {}
    keys: frozenset[str] = frozenset()

    @property
    def driver_step(self) -> str:
        """``runfile`` when one of its platforms installs its driver (the lock then records a
        ``driver_runfile_url``), else ``check``: what ``fleet/lockfleet.py`` still asks of
        the recipe's kind."""
        served_on = platforms.serving(self.kind, self.platforms)
        runfile = any(p.driver_step == "runfile" for p in served_on)
        return "runfile" if runfile else "check"

    # -- recipes

    def detect(self, path: Path, text: str) -> bool:
        """Whether a recipe file (its path and text) is of this kind."""
        raise NotImplementedError

    def locate(self, rest: str, base: Path) -> Path | None:
        """The file of the qualified name ``<kind>/<rest>`` under ``base``, if there is one."""
        return None

    def names(self, base: Path) -> list[str]:
        """Qualified names of this kind's recipes under ``base``, sorted."""
        return []

    def path_of(self, recipe: str) -> Path:
        """The file of a recipe of this kind that data names (a path, or ``<kind>/<rest>``
        under the shipped recipes).

        + recipe: ``serve_recipe``
        """
        p = Path(recipe)
        if p.is_file():
            return p
        kind, _, rest = recipe.partition("/")
        path = self.locate(rest, RECIPES_DIR) if kind == self.kind and rest else None
        if path is None:
            raise RecipeError(f"no {self.kind} recipe {recipe!r} under {RECIPES_DIR}")
        return path

    def show(self, path: Path, name: str) -> dict[str, Any]:
        """What ``servefleet recipes show`` prints: axes, allowed values, defaults, targets."""
        raise NotImplementedError

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        """Resolve a selection; ``options`` maps the keywords of :attr:`options` to values."""
        raise NotImplementedError

    # -- hosts

    def resolve_data(self, settings: Wants, sku: str | None = None) -> ServeSpec:
        """The serving spec the data selects (for the host's device model, once known)."""
        raise NotImplementedError

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
        """Why this host must not serve the spec (one line), or None: its devices (as its
        platform read them) against what the recipe needs."""
        raise NotImplementedError

    def release_extras(self, spec: ServeSpec) -> list[str]:
        """The extras of the release's top package the selection needs (each brings the
        packages ``sdk_extra_packages`` names for it; the others are not installed)."""
        return []

    def unit_data(self, options: Mapping[str, Any], data: dict[str, Any]) -> None:
        """What :meth:`resolve`'s ``options`` set in the data a resolved unit is rendered under
        (``servefleet resolve --format unit``), in place; nothing by default.

        + options: the keywords of :attr:`options` and their values
        + data: every data key, the defaults
        """
