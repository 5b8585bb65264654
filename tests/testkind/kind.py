"""The testkind: recipes are JSON with a ``testkind`` object (a model, the boxes a server takes,
its arguments); hosts list their boxes in ``<state>/devices`` (``<index> <model>`` lines) and
their driver in ``<state>/driver.json``, which its driver step writes and checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.base import DriverPlan, Hardware, Kind, ResolveOption, Wants
from servefleet.spec import Requirements, Server, ServeSpec
from testkind import defaults

RECIPE = Path(__file__).resolve().parent / "recipes" / "tiny.json"
MODEL = "TB-1"  # the only box model its recipes run on


class Testkind(Kind):
    """The kind, its host files under ``state``.

    + state: the directory that stands for the host's devices and driver
    + writes: the driver version its install writes (default: the wanted one; another makes
      the step's check fail)
    """

    __test__ = False  # a kind, not a test class
    kind = "testkind"
    label = "a testkind recipe"
    title = "Testkind"
    options = (ResolveOption("--lanes", "lanes", "boxes a server takes.", type=int),)
    name = "testbox"
    defaults = defaults.DEFAULTS
    devices_env = "TESTBOX_VISIBLE_DEVICES"
    device_word = "boxes"
    driver_step = "runfile"

    def __init__(self, state: str, writes: str | None = None) -> None:
        self.state = state
        self.writes = writes
        self.probe_commands = (
            ("boxes", ("cat", f"{state}/devices"), "lines", None),
            ("box_driver", ("cat", f"{state}/driver.json"), "json", None),
        )

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

    def hardware(self, probe: dict[str, Any]) -> Hardware:
        rows = [line.split() for line in probe.get("boxes") or []]
        driver = probe.get("box_driver") or {}
        return Hardware(
            "testbox-list",
            tuple(r[1] for r in rows),
            tuple(int(r[0]) for r in rows),
            driver.get("version") if isinstance(driver, dict) else None,
        )

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
        if not hardware.devices:
            return f"no testbox found (by {hardware.source})"
        return None if hardware.sku == MODEL else f"host boxes {hardware.skus} are not {MODEL}"

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        return hardware.driver_version != settings.driver_version

    def driver_plan(self, settings: Wants, kernel: str) -> DriverPlan:
        version = settings.driver_version
        written = json.dumps({"version": self.writes or version})
        return DriverPlan(
            version=version,
            install=(
                "sh",
                "-c",
                f"echo installing; printf %s '{written}' >{self.state}/driver.json",
            ),
            log=f"{self.state}/install-{version}.log",
            check=(("cat", f"{self.state}/driver.json"), "version"),
        )

    def required_pins(self) -> tuple[str, ...]:
        return ("testbox-serve",)

    def top_requirement(self, settings: Wants, spec: ServeSpec) -> tuple[str, str]:
        return f"testbox-serve=={settings.sdk_pins['testbox-serve']}", "testbox-serve"

    def first_start_timeout(self, settings: Wants) -> int:
        return settings.serve_load_timeout


def _recipe(path: Path) -> dict[str, Any]:
    recipe = json.loads(path.read_text())["testkind"]
    if not isinstance(recipe.get("model"), str):
        raise RecipeError(f"{path}: testkind.model: not a model id")
    return dict(recipe)
