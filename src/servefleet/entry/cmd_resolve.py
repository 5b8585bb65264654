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


def _render(spec: Any, fmt: str, unit: Callable[[], str]) -> str:
    if fmt == "json":
        return json.dumps(spec.to_json(), indent=2, ensure_ascii=False)
    if fmt == "shell":
        if len(spec.servers) == 1 and not spec.router:
            return shell_command(spec.servers[0])
        lines = [f"# role: {s.role}\n{shell_command(s)}" for s in spec.servers]
        if spec.router:
            from servefleet.spec import Server

            lines.append(f"# router\n{shell_command(Server('router', spec.router, {}))}")
        return "\n".join(lines)
    if len(spec.servers) != 1:
        roles = ", ".join(s.role for s in spec.servers)
        raise RecipeError(f"--format unit renders one server; this selection has {roles}")
    return unit()


@click.command("resolve")
@click.argument("recipe", shell_complete=common.complete_recipe)
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
    "--kv-offload", default=None, metavar="NAME", help="vLLM: a KV-offload option of the taxonomy."
)
@click.option("--task", default=None, help="vLLM: an omni recipe's task (default: its first).")
@click.option(
    "--pool-parallelism",
    default=None,
    metavar="tp|tep|dep",
    help="vLLM: pd_cluster only: the prefill and decode pools' parallelism (default: the recipe's).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "shell", "unit"]),
    default="json",
    show_default=True,
    help="Output: JSON spec, a pasteable shell line, a systemd unit: the unit deploys/serve.py "
    "writes for instance 0 under the default data with this recipe as serve_recipe.",
)
def resolve_cmd(recipe: str, strategy: str | None, fmt: str, **options: Any) -> None:
    """Resolve a selection of RECIPE (a path or a name such as rbln/gpt-oss-120b) to the exact
    argv and env of each server.

    Example:

        servefleet resolve rbln/gpt-oss-120b --target throughput --set lmcache=cpu --format shell
    """
    from servefleet.kinds import KINDS, find

    source, path = find(recipe)
    flags = {flag: key for s in KINDS for flag, key in s.options.items()}
    foreign = [f for f, key in flags.items() if f not in source.options and _given(options[key])]
    if foreign:
        raise RecipeError(
            f"{', '.join(foreign)} {'applies' if len(foreign) == 1 else 'apply'} to the other "
            f"kind of recipe only: {recipe} is {source.label} "
            f"(its options: {', '.join((*source.options, *_COMMON_OPTIONS))})"
        )
    own = {key: options[key] for key in source.options.values()}
    spec = source.resolve(path, recipe, strategy, own)
    click.echo(_render(spec, fmt, lambda: _unit(spec, own.get("compiler_version"))))


def _unit(spec: Any, compiler_version: str | None) -> str:
    """The unit ``deploys/serve.py`` writes for instance 0 of this selection (devices
    ``0..n-1``) under the default data with ``serve_recipe`` set to the spec's recipe."""
    from servefleet.base.remote.layout import NETRC
    from servefleet.hostplan.instance_unit import render_instance
    from servefleet.release.plan import plan_release
    from servefleet.settings.table import default_settings

    settings = default_settings(spec.recipe, compiler_version)
    devices = ",".join(str(d) for d in range(spec.servers[0].npus))
    release = plan_release(settings, spec, NETRC)
    return render_instance(settings, spec, release, 0, devices)[0].rstrip("\n")
