"""``servefleet``: a thin click CLI over the library (recipes, resolve, lab)."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="servefleet")
def main() -> None:
    """Recipes to warm, health-checked vllm serve instances on a fleet."""


def _register() -> None:
    from servefleet.lab.cli import lab

    main.add_command(lab)


_register()
