"""What every recipe source offers the registry and the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.spec import ServeSpec


class Source:
    """One kind of recipe file: how to recognise it, name it, show it, resolve it.

    + kind: the first part of its qualified names (``rbln/...``, ``vllm/...``)
    + label: how errors name a recipe of this source (``an RBLN recipe card``)
    + options: the ``servefleet resolve`` options it takes: CLI flag -> keyword of :meth:`resolve`
    """

    kind: str
    label: str
    options: Mapping[str, str]

    def detect(self, path: Path, text: str) -> bool:
        """Whether a recipe file (its path and text) is of this source."""
        raise NotImplementedError

    def locate(self, rest: str, base: Path) -> Path | None:
        """The file of the qualified name ``<kind>/<rest>`` under ``base``, if there is one."""
        return None

    def names(self, base: Path) -> list[str]:
        """Qualified names of this source's recipes under ``base``, sorted."""
        return []

    def show(self, path: Path, name: str) -> dict[str, Any]:
        """What ``servefleet recipes show`` prints: axes, allowed values, defaults, targets."""
        raise NotImplementedError

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        """Resolve a selection; ``options`` maps the keywords of :attr:`options` to values."""
        raise NotImplementedError

    def unit(self, spec: ServeSpec, options: Mapping[str, Any]) -> str:
        """The unit ``deploys/serve.py`` writes for instance 0 of this selection (devices
        ``0..n-1``) under the default data with ``serve_recipe`` set to this recipe."""
        from servefleet.hostplan import NETRC, render_instance
        from servefleet.release import plan_release

        settings = default_settings(spec.recipe, options.get("compiler_version"))
        devices = ",".join(str(d) for d in range(spec.servers[0].npus))
        release = plan_release(settings, spec, NETRC)
        return render_instance(settings, spec, release, 0, devices)[0].rstrip("\n")


def default_settings(recipe: str | None = None, compiler_version: str | None = None) -> Any:
    """The deploy's settings from the default data (``serve_recipe`` and the rebel-compiler pin
    replaced when given). Credentials are not read: nothing rendered from these holds them.

    + recipe: the recipe to serve instead of the default's
    + compiler_version: the rebel-compiler version to pin instead of the default's
    """
    from servefleet.data import load_defaults, settings_from

    data = load_defaults()
    if recipe:
        data["serve_recipe"] = recipe
    if compiler_version:
        data["sdk_pins"] = [
            f"rebel-compiler=={compiler_version}" if p.startswith("rebel-compiler==") else p
            for p in data["sdk_pins"]
        ]
    unused = {data[key]: "-" for key in ("creds_index_user_env", "creds_index_password_env")}
    return settings_from(data.get, unused)
