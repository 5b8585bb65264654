"""``servefleet``: a thin click CLI over the library (recipes, resolve, lab).

User errors (:class:`ServefleetError`, click usage errors) print one line
``servefleet: error: ...`` on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from servefleet.errors import RecipeError, ServefleetError


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
            _fail(exc.format_message(), 2 if isinstance(exc, click.UsageError) else exc.exit_code)
        except ServefleetError as exc:
            _fail(str(exc), 2)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _fail(message: str, code: int) -> None:
    one_line = " ".join(message.split())
    click.echo(f"servefleet: error: {one_line}", err=True)
    sys.exit(code)


@click.group(cls=_Group)
@click.version_option(package_name="servefleet")
def main() -> None:
    """Recipes to warm, health-checked vllm serve instances on a fleet."""


# ---------------------------------------------------------------------------------------------
# recipes


@main.group("recipes")
def recipes_group() -> None:
    """List and inspect the shipped recipes (rbln/<name>, vllm/<org>/<name>)."""


@recipes_group.command("list")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
def recipes_list(directory: Path | None) -> None:
    """Print the qualified names of the recipes under DIRECTORY (default: the shipped ones).

    Example:

        servefleet recipes list
    """
    from servefleet.sources import list_recipes

    if directory is not None and not directory.is_dir():
        raise RecipeError(f"{directory}: not a directory")
    for name in list_recipes(directory):
        click.echo(name)


@recipes_group.command("show")
@click.argument("recipe")
def recipes_show(recipe: str) -> None:
    """Show a recipe's axes with allowed values, defaults, recommended, targets and strategies.

    Example:

        servefleet recipes show rbln/gpt-oss-120b
    """
    from servefleet.sources import find

    source, path = find(recipe)
    click.echo(json.dumps(source.show(path, recipe), indent=2, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# resolve

_COMMON_OPTIONS = ("--strategy", "--format")


def _given(value: Any) -> bool:
    """Whether the user gave an option: a number (0 too), a set flag, a non-empty value."""
    return (isinstance(value, int) and not isinstance(value, bool)) or bool(value)


def shell_command(server: Any) -> str:
    """One pasteable line: env assignments then the argv, each quoted for a POSIX shell.

    + server: a :class:`servefleet.spec.Server`
    """
    words = [f"{k}={shlex.quote(v)}" for k, v in server.env.items()]
    words += [shlex.quote(a) for a in server.argv]
    return " ".join(words)


def _render(spec: Any, fmt: str, unit: Callable[[], str]) -> str:
    if fmt == "json":
        return json.dumps(spec.to_json(), indent=2, ensure_ascii=False)
    if fmt == "shell":
        if len(spec.servers) == 1:
            return shell_command(spec.servers[0])
        return "\n".join(f"# role: {s.role}\n{shell_command(s)}" for s in spec.servers)
    if len(spec.servers) != 1:
        roles = ", ".join(s.role for s in spec.servers)
        raise RecipeError(f"--format unit renders one server; this selection has {roles}")
    return unit()


@main.command("resolve")
@click.argument("recipe")
@click.option("--target", default=None, help="RBLN: Latency (default) or Throughput, any case.")
@click.option("--strategy", default=None, help="Strategy slug (default: the recipe's).")
@click.option("--set", "sets", multiple=True, metavar="AXIS=VALUE", help="RBLN: choose a value.")
@click.option("--recommended", is_flag=True, help="RBLN: start from the recommended values.")
@click.option("--sku", default=None, help="RBLN: NPU SKU (default: the option's first).")
@click.option(
    "--compiler-version",
    default=None,
    metavar="X.Y.Z",
    help="RBLN: rebel-compiler version for the fingerprint (default: the data's pin).",
)
@click.option("--hardware", default=None, help="vLLM: GPU id (h200, mi300x, b200, ...).")
@click.option("--variant", default=None, help="vLLM: recipe variant.")
@click.option("--tp", type=int, default=None, help="vLLM: tensor-parallel size override.")
@click.option(
    "--feature",
    "features",
    multiple=True,
    metavar="NAME[=MODE]",
    help="vLLM: turn a feature on (or pick its mode).",
)
@click.option(
    "--no-feature", "no_features", multiple=True, metavar="NAME", help="vLLM: turn a feature off."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "shell", "unit"]),
    default="json",
    show_default=True,
    help="Output: JSON spec, a pasteable shell line, a systemd unit. RBLN: the unit "
    "deploys/serve.py writes for instance 0 under the default data; vLLM recipes (no deploy "
    "yet): the server's own argv and env as a unit.",
)
def resolve_cmd(recipe: str, strategy: str | None, fmt: str, **options: Any) -> None:
    """Resolve a selection of RECIPE (a path or a name such as rbln/gpt-oss-120b) to the exact
    argv and env of each server.

    Example:

        servefleet resolve rbln/gpt-oss-120b --target throughput --set lmcache=cpu --format shell
    """
    from servefleet.sources import SOURCES, find

    source, path = find(recipe)
    flags = {flag: key for s in SOURCES for flag, key in s.options.items()}
    foreign = [f for f, key in flags.items() if f not in source.options and _given(options[key])]
    if foreign:
        raise RecipeError(
            f"{', '.join(foreign)} {'applies' if len(foreign) == 1 else 'apply'} to the other "
            f"kind of recipe only: {recipe} is {source.label} "
            f"(its options: {', '.join((*source.options, *_COMMON_OPTIONS))})"
        )
    own = {key: options[key] for key in source.options.values()}
    spec = source.resolve(path, recipe, strategy, own)
    click.echo(_render(spec, fmt, lambda: source.unit(spec, own)))


# ---------------------------------------------------------------------------------------------
# fleet


DEPLOYS = Path(__file__).resolve().parents[2] / "deploys"


@main.command(
    "rollback", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.argument("inventory")
@click.option("--limit", default=None, help="Only these hosts or groups (as pyinfra's --limit).")
@click.argument("pyinfra_args", nargs=-1, type=click.UNPROCESSED)
def rollback_cmd(inventory: str, limit: str | None, pyinfra_args: tuple[str, ...]) -> None:
    """Roll hosts back to the state before their last good deploy (units, release, servers),
    through the health gate. Arguments after ``--`` go to pyinfra as they are."""
    import subprocess

    pyinfra = str(Path(sys.executable).parent / "pyinfra")
    cmd = [pyinfra, "-y", *(["--limit", limit] if limit else []), *pyinfra_args, inventory]
    sys.exit(subprocess.run([*cmd, str(DEPLOYS / "rollback.py")]).returncode)


def _register() -> None:
    from servefleet.lab.chat import chat
    from servefleet.lab.cli import lab

    lab.add_command(chat)
    main.add_command(lab)


_register()
