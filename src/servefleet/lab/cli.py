"""``servefleet lab up|down|status|env``."""

from __future__ import annotations

import click


@click.group()
def lab() -> None:
    """The local lab fleet (needs root)."""
