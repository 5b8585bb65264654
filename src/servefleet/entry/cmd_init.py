"""``init``: a new fleet repository (inventories, group_data, thin deploys, locks) that depends
on this package."""

from __future__ import annotations

import click


@click.command("init")
@click.argument("directory")
def init(directory: str) -> None:
    """A new fleet repository in DIRECTORY that depends on this package: inventories (prod with a
    canary, lab), group_data (every key a site usually sets, commented with its default), thin
    deploys/*.py, locks/. Refuses, changing nothing, when any of its files exists.

    Example:

        servefleet init fleet && cd fleet && servefleet lab up && pyinfra -y inventories/lab.py deploys/serve.py
    """
    from servefleet.fleet.scaffold import init as scaffold

    for rel in scaffold(directory):
        click.echo(f"{directory.rstrip('/')}/{rel}")
