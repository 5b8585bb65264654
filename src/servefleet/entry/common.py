"""What the commands share: their ``--json`` output, whether stderr shows progress, the options
every fleet command takes alike (``--limit``, ``--data``, ``--selection``), and shell completion
(click's) of inventory files, recipe names and ``--limit`` hosts and groups."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click


def echo_json(data: Any, sort_keys: bool = True) -> None:
    """The ``--json`` output of every command: one JSON document on stdout (``keys``: in the
    key table's order)."""
    click.echo(json.dumps(data, indent=1, sort_keys=sort_keys))


def shows_progress() -> bool:
    """Whether a progress bar is drawn: stderr is a terminal (a log gets the lines only)."""
    return sys.stderr.isatty()


def fleet_options(command: Any) -> Any:
    """The options every fleet command (plan, status, rollout, rollback, lock, monitoring,
    wheelhouse) takes alike, as options of the command: ``--limit PATTERN``, ``--data
    KEY=VALUE`` and ``--selection AXIS=VALUE`` (each repeatable), passed as ``limits``,
    ``data`` and ``selection``."""
    limit = click.option(
        "--limit", "limits", multiple=True, metavar="PATTERN",
        help="Only these hosts: a group name, else a glob of host names (repeatable, as "
        "pyinfra's --limit; a --limit after -- counts too).",
        shell_complete=complete_limit,
    )  # fmt: skip
    data = click.option(
        "--data", "data", multiple=True, metavar="KEY=VALUE",
        help="Data over every host, read as pyinfra reads --data (repeatable; e.g. "
        "serve_target=Throughput).",
    )  # fmt: skip
    selection = click.option(
        "--selection", "selection", multiple=True, metavar="AXIS=VALUE",
        help="This selection on every host, in place of the data's serve_selection (repeatable; "
        "e.g. lmcache=cpu).",
    )  # fmt: skip
    return limit(data(selection(command)))


# ---------------------------------------------------------------------------------------------
# shell completion (click's): inventory files, recipe names, --limit hosts


def complete_inventory(_ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """Inventory files for INVENTORY: the ``*.py`` files and the directories that start with
    what is typed (``inventories/`` first, as `servefleet init` makes it)."""
    import glob

    from click.shell_completion import CompletionItem

    folder, sep, stem = incomplete.rpartition("/")
    root = Path(folder + sep or ".")
    try:
        found = sorted(root.glob(f"{glob.escape(stem)}*"))
    except (OSError, ValueError):
        return []
    out = []
    for path in found:
        shown = f"{folder}{sep}{path.name}"
        if path.is_dir() and not path.name.startswith((".", "__")):
            out.append(CompletionItem(f"{shown}/"))
        elif path.suffix == ".py":
            out.append(CompletionItem(shown))
    return out


def complete_recipe(_ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """Recipe names (``rbln/<name>``, ``vllm/<org>/<name>``) that start with what is typed."""
    from click.shell_completion import CompletionItem

    from servefleet.kinds import list_recipes

    try:
        return [CompletionItem(n) for n in list_recipes(None) if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 (completion never fails: it offers nothing)
        return []


def complete_limit(ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """The inventory's groups and host names for ``--limit`` (the INVENTORY already typed,
    read with pyinfra's loader; nothing when it cannot be read)."""
    from click.shell_completion import CompletionItem

    from servefleet.fleet.inventory import read_inventory

    # before the value of an option, click's parse leaves the arguments in ctx.args
    given = [a for a in ctx.args if not a.startswith("-")]
    inventory = ctx.params.get("inventory") or (given[0] if given else None)
    if not inventory:
        return []
    try:
        fleet = read_inventory(inventory)
    except Exception:  # noqa: BLE001 (completion never fails: it offers nothing)
        return []
    names = [*sorted(fleet.groups), *fleet.order]
    return [CompletionItem(n) for n in dict.fromkeys(names) if n.startswith(incomplete)]
