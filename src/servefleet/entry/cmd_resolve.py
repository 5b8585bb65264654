"""``resolve``: a selection of a recipe to the exact argv and env of each server, as a JSON
spec, a pasteable shell line or the systemd unit the deploy writes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from servefleet.base.errors import RecipeError
from servefleet.entry import common

_COMMON_OPTIONS = ("--strategy", "--format")


def _given(value: Any) -> bool:
    """Whether the user gave an option: a number (0 too), a set flag, a non-empty value."""
    return (isinstance(value, int) and not isinstance(value, bool)) or bool(value)


def shell_command(server: Any) -> str:
    """One pasteable line: env assignments then the argv, each quoted for a POSIX shell; a
    placeholder (``$PREFILL_NODE_1``) is left for the shell to expand, as the recipes site
    prints it.

    + server: a :class:`servefleet.spec.Server`
    """
    from servefleet.kinds.roles import shell_word

    words = [f"{k}={shell_word(v)}" for k, v in server.env.items()]
    words += [shell_word(a) for a in server.argv]
    return " ".join(words)


def _render(spec: Any, fmt: str, unit: Callable[[Any], str]) -> str:
    if fmt == "json":
        return json.dumps(spec.to_json(), indent=2, ensure_ascii=False)
    if fmt == "shell":
        if len(spec.servers) == 1 and not spec.router:
            return shell_command(spec.servers[0])
        lines = [f"# {_title(spec, s)}\n{shell_command(s)}" for s in spec.servers]
        if spec.router:
            from servefleet.spec import Server

            lines.append(f"# router\n{shell_command(Server('router', spec.router, {}))}")
        return "\n".join(lines)
    if spec.nodes > 1:  # a serving group: the unit of each rank, each on its own host
        return "\n".join(f"# {_title(spec, s)}\n{unit(s)}" for s in spec.servers)
    if len(spec.servers) != 1:
        roles = ", ".join(s.role for s in spec.servers)
        raise RecipeError(f"--format unit renders one server; this selection has {roles}")
    return unit(spec.servers[0])


def _title(spec: Any, server: Any) -> str:
    """The line above a server of a selection of several: its role, or its rank in a group."""
    if spec.nodes == 1:
        return f"role: {server.role}"
    what = "headless" if "--headless" in server.argv else "serves an API"
    return f"rank {server.rank} of {spec.nodes}, one host each ({what}; the deploy binds $HEAD_IP)"


def resolve_command() -> click.Command:
    """``servefleet resolve`` with the options of every registered kind (``Kind.options``, their
    help prefixed with the kind's title), between ``--strategy`` and ``--format``."""
    from servefleet.kinds import KINDS

    params: list[click.Parameter] = [
        click.Argument(["recipe"], shell_complete=common.complete_recipe),
        click.Option(["--strategy"], default=None, help="Strategy slug (default: the recipe's)."),
    ]
    for kind in KINDS:
        for o in kind.options:
            params.append(
                click.Option(
                    [o.flag, o.key],
                    default=None,
                    help=f"{kind.title}: {o.help}",
                    metavar=o.metavar,
                    type=None if o.is_flag else o.type,
                    multiple=o.multiple,
                    is_flag=o.is_flag,
                )
            )
    params.append(
        click.Option(
            ["--format", "fmt"],
            type=click.Choice(["json", "shell", "unit"]),
            default="json",
            show_default=True,
            help="Output: JSON spec, a pasteable shell line, a systemd unit: the unit "
            "deploys/serve.py writes for instance 0 under the default data with this recipe as "
            "serve_recipe.",
        )
    )
    return click.Command("resolve", callback=_resolve, params=params, help=_resolve.__doc__)


def _resolve(recipe: str, strategy: str | None, fmt: str, **options: Any) -> None:
    """Resolve a selection of RECIPE (a path or a name such as rbln/gpt-oss-120b) to the exact
    argv and env of each server.

    Example:

        servefleet resolve rbln/gpt-oss-120b --target throughput --set lmcache=cpu --format shell
    """
    from servefleet.kinds import find

    source, path = find(recipe)
    mine = {o.flag for o in source.options}
    foreign = [flag for flag, key in _flags(options) if flag not in mine and _given(options[key])]
    if foreign:
        raise RecipeError(
            f"{', '.join(foreign)} {'applies' if len(foreign) == 1 else 'apply'} to the other "
            f"kind of recipe only: {recipe} is {source.label} "
            f"(its options: {', '.join((*(o.flag for o in source.options), *_COMMON_OPTIONS))})"
        )
    own = {o.key: options.get(o.key) for o in source.options}
    spec = source.resolve(path, recipe, strategy, own)
    click.echo(_render(spec, fmt, lambda server: _unit(spec, own, server)))


def _flags(options: dict[str, Any]) -> list[tuple[str, str]]:
    """Every registered kind's options this command was made with: (flag, keyword)."""
    from servefleet.kinds import KINDS

    return [(o.flag, o.key) for k in KINDS for o in k.options if o.key in options]


resolve_cmd = resolve_command()


def _unit(spec: Any, options: dict[str, Any], server: Any) -> str:
    """The unit ``deploys/serve.py`` writes for instance 0 of this selection (devices
    ``0..n-1``) under the default data with ``serve_recipe`` set to the spec's recipe (and what
    its kind reads of the options: RBLN's ``--compiler-version`` pinned); a rank of a serving
    group (``server``) as in group ``GROUP``, its hash left ``-``."""
    from servefleet.base.remote.layout import NETRC
    from servefleet.hostplan.instance_unit import instance_unit, render_instance
    from servefleet.release.plan import plan_release
    from servefleet.settings.table import default_settings

    settings = default_settings(spec.recipe, options)
    devices = ",".join(str(d) for d in range(spec.servers[0].npus))
    release = plan_release(settings, spec, NETRC)
    if spec.nodes == 1:
        return render_instance(settings, spec, release, 0, devices)[0].rstrip("\n")
    text = instance_unit(settings, spec, release, 0, devices, server=server, group=("GROUP", "-"))
    return text[0].rstrip("\n")
