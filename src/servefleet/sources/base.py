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
        """``--format unit`` of a one-server spec: here the spec's own argv and env as a unit."""
        from servefleet.systemd import unit_text

        server = spec.servers[0]
        return unit_text(server.argv, server.env, description=f"servefleet {spec.recipe}").rstrip(
            "\n"
        )
