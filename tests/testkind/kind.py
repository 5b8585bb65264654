"""The testkind: recipes are JSON with a ``testkind`` object (a model, the boxes a server takes,
its arguments), served on testbox hosts (its platform, :mod:`testkind.platform`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.base import Hardware, Kind, ResolveOption, Wants
from servefleet.spec import Requirements, Server, ServeSpec
from testkind import defaults

RECIPE = Path(__file__).resolve().parent / "recipes" / "tiny.json"
MODEL = "TB-1"  # the only box model its recipes run on


class Testkind(Kind):
    """The recipe family: its recipes, served on the testbox platform."""

    __test__ = False  # a kind, not a test class
    kind = "testkind"
    label = "a testkind recipe"
    title = "Testkind"
    options = (ResolveOption("--lanes", "lanes", "boxes a server takes.", type=int),)
    platforms = ("testbox",)
    defaults = defaults.DEFAULTS

    # -- recipes

    def detect(self, path: Path, text: str) -> bool:
        try:
            return isinstance(json.loads(text).get("testkind"), dict)
        except (ValueError, AttributeError):
            return False

    def show(self, path: Path, name: str) -> dict[str, Any]:
        return {"recipe": name, "kind": self.kind, **_recipe(path)}

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        recipe = _recipe(path)
        lanes = options.get("lanes") or recipe["lanes"]
        server = Server(
            "main",
            ["vllm", "serve", recipe["model"], *recipe["args"]],
            {"TESTBOX_LANES": str(lanes)},
            npus=lanes,
        )
        return ServeSpec(
            recipe=name,
            kind=self.kind,
            selection={"lanes": str(lanes)},
            servers=[server],
            requirements=Requirements(models=[recipe["model"]]),
            skus=[MODEL],
        )

    # -- hosts

    def resolve_data(self, settings: Wants, sku: str | None = None) -> ServeSpec:
        path = self.path_of(settings.serve_recipe)
        return self.resolve(path, settings.serve_recipe, settings.serve_strategy, {})

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
        if not hardware.devices:
            return f"no testbox found (by {hardware.source})"
        return None if hardware.sku == MODEL else f"host boxes {hardware.skus} are not {MODEL}"


def _recipe(path: Path) -> dict[str, Any]:
    recipe = json.loads(path.read_text())["testkind"]
    if not isinstance(recipe.get("model"), str):
        raise RecipeError(f"{path}: testkind.model: not a model id")
    return dict(recipe)
