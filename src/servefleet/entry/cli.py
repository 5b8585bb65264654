"""``servefleet``: a thin click CLI over the library (recipes, resolve, lab).

User errors (:class:`ServefleetError`, click usage errors) print one line
``servefleet: error: ...`` on stderr and exit 2, never a traceback; something the command could
not reach (:class:`Unreachable`: an index, a host, the hub) the same line and exit 3. Every exit
status is one of :class:`servefleet.base.exitcodes.Exit` (docs/exit-codes.md).

Shell completion is click's (``_SERVEFLEET_COMPLETE=bash_source servefleet``): it completes
commands and options, inventory files, recipe names and ``--limit`` hosts and groups.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from servefleet.base.errors import ServefleetError, Unreachable
from servefleet.base.exitcodes import Exit


class _Group(click.Group):
    """A click group that turns user errors into one ``servefleet: error:`` line (exit 2)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            usage = isinstance(exc, click.UsageError)
            _fail(exc.format_message(), Exit.USAGE if usage else exc.exit_code)
        except Unreachable as exc:
            _fail(str(exc), Exit.UNREACHABLE)
        except ServefleetError as exc:
            *first, last = getattr(exc, "lines", None) or [str(exc)]
            for line in first:  # every problem of the data, each on its own line
                click.echo(f"servefleet: error: {line}", err=True)
            _fail(last, Exit.USAGE)
        except OSError as exc:  # what the system refused, not caught where it happened
            _fail(*_os_error(exc))
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(Exit.FAILED)
        sys.exit(rv if isinstance(rv, int) else Exit.OK)


def _os_error(exc: OSError) -> tuple[str, Exit]:
    """An ``OSError`` no command caught, as one line and its exit: the network's (a connection
    refused or reset, a timeout, a name that does not resolve) exit 3; a path's (no such file,
    permission denied, not a directory) exit 2, naming the path."""
    from servefleet.base.remote.retry import reason, transient

    if transient(exc):
        return f"could not reach it ({reason(exc)})", Exit.UNREACHABLE
    where = exc.filename if exc.filename is not None else ""
    also = f" -> {exc.filename2}" if exc.filename2 is not None else ""
    why = exc.strerror or str(exc)
    return (f"{where}{also}: {why}" if where else why), Exit.USAGE


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    click.echo(f"servefleet: error: {one_line}", err=True)
    sys.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "-V", "--version", package_name="servefleet")
def main() -> None:
    """Recipes to warm, health-checked vllm serve instances on a fleet."""


def _register() -> None:
    from servefleet.entry import cmd_fleet, cmd_init, cmd_lock, cmd_recipes, cmd_resolve
    from servefleet.fleet.lab.chat import chat
    from servefleet.fleet.lab.cli import lab

    for command in (
        cmd_recipes.recipes_group,
        cmd_recipes.keys_cmd,
        cmd_recipes.docs_cmd,
        cmd_resolve.resolve_cmd,
        cmd_fleet.rollback_cmd,
        cmd_fleet.plan_cmd,
        cmd_fleet.status_cmd,
        cmd_fleet.rollout_cmd,
        cmd_init.init,
        cmd_init.monitoring_cmd,
        cmd_lock.lock_cmd,
        cmd_lock.wheelhouse_cmd,
    ):
        main.add_command(command)
    lab.add_command(chat)
    main.add_command(lab)


_register()
