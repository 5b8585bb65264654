"""``init``: a new fleet repository (inventories, group_data, thin deploys, locks, the monitoring
kit) that depends on this package; ``monitoring``: the kit's Prometheus rules rendered from an
inventory's data."""

from __future__ import annotations

import os
from pathlib import Path

import click

from servefleet.entry import common


@click.command("init")
@click.argument("directory")
def init(directory: str) -> None:
    """A new fleet repository in DIRECTORY that depends on this package: inventories (prod with a
    canary, lab), group_data (every key a site usually sets, commented with its default), thin
    deploys/*.py, locks/, monitoring/ (Prometheus rules, a Grafana dashboard, a prometheus.yml
    example). Refuses, changing nothing, when any of its files exists.

    Example:

        servefleet init fleet && cd fleet && servefleet lab up && pyinfra -y inventories/lab.py deploys/serve.py
    """
    from servefleet.fleet.scaffold import init as scaffold

    for rel in scaffold(directory):
        click.echo(f"{directory.rstrip('/')}/{rel}")


@click.command("monitoring")
@click.argument("inventory", shell_complete=common.complete_inventory)
@common.fleet_options
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the rules to this file (atomically) instead of stdout.",
)
def monitoring_cmd(
    inventory: str,
    limits: tuple[str, ...],
    data: tuple[str, ...],
    selection: tuple[str, ...],
    out: Path | None,
) -> None:
    """The monitoring kit's Prometheus rules (recording rules and alerts) with the thresholds of
    the inventory's data (monitoring_thresholds, one value for every host). Reads the data only,
    checked whole as every fleet command checks it: no host is contacted, no index credentials
    are needed.

    Example:

        servefleet monitoring inventories/prod.py --out monitoring/servefleet-rules.yml
    """
    from servefleet.base.errors import ServefleetError
    from servefleet.base.files import write_atomic
    from servefleet.fleet.inventory import command_overrides, read_inventory
    from servefleet.fleet.monitoring.kit import fleet_thresholds, rules
    from servefleet.settings.across import NO_INDEX

    if out and not out.parent.is_dir():
        raise click.BadParameter(f"{out}: its directory {out.parent} does not exist",
                                 param_hint="'--out'")  # fmt: skip
    fleet = read_inventory(inventory, command_overrides(data, selection))
    names = fleet.select(limits) if limits else None
    text = rules(fleet_thresholds(fleet.settings(names, environ={**os.environ, NO_INDEX: "1"})))
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        write_atomic(out, text)
    except OSError as e:
        raise ServefleetError(f"--out {out}: not written ({e.strerror})") from None
    click.echo(str(out))
