"""``servefleet lab up|down|status|env|models|ssh|republish|offline``."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from servefleet.base.errors import ServefleetError
from servefleet.base.exitcodes import Exit
from servefleet.fleet.lab import layout
from servefleet.fleet.lab.base import DEFAULT_SUITE, SUITES, base_note

F = TypeVar("F", bound=Callable[..., Any])


def _one_line_errors(func: F) -> F:
    """Print a ServefleetError as one line on stderr and exit 2 (no traceback)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ServefleetError as exc:
            click.echo(f"servefleet lab: {exc}", err=True)
            sys.exit(Exit.USAGE)

    return wrapper  # type: ignore[return-value]


def _per_host(
    values: tuple[str, ...], what: str = "SKU", example: str = "lab3=RBLN-CA25"
) -> dict[str, str]:
    """HOST=VALUE options as a dict (a later one for the same host wins).

    + values: the option's values
    + what: the VALUE's name in the error
    + example: a valid value, for the error
    """
    found = {}
    for value in values:
        host, sep, item = value.partition("=")
        if not sep or not host or not item:
            raise click.BadParameter(f"{value!r} is not HOST={what} (e.g. {example})")
        found[host] = item
    return found


def _groups(values: tuple[str, ...]) -> dict[str, list[str]]:
    """GROUP=HOST options as group -> hosts."""
    found: dict[str, list[str]] = {}
    for value in values:
        group, sep, host = value.partition("=")
        if not sep or not re.fullmatch(r"[a-z0-9_-]+", group) or not host:
            raise click.BadParameter(f"{value!r} is not GROUP=HOST (e.g. router=lab3)")
        found.setdefault(group, []).append(host)
    return found


@click.group(context_settings={"help_option_names": ["-h", "--help"]})  # also invoked alone
def lab() -> None:
    """The local lab fleet (needs root)."""


@lab.command()
@click.option("--hosts", default=layout.DEFAULT_HOSTS, show_default=True, help="number of hosts")
@click.option(
    "--devices", default=layout.DEFAULT_DEVICES, show_default=True, help="simulated NPUs per host"
)
@click.option(
    "--odd-sku",
    "odd_sku",
    multiple=True,
    metavar="HOST=SKU",
    help="make one host another card SKU (repeatable), e.g. lab3=RBLN-CA25",
)
@click.option(
    "--hardware",
    default=layout.DEFAULT_HARDWARE,
    show_default=True,
    metavar="|".join(layout.LAB_HARDWARE),
    help="every host's hardware: RBLN-CR13 NPUs, or 8 NVIDIA H200 GPUs with their driver",
)
@click.option(
    "--odd-hardware",
    "odd_hardware",
    multiple=True,
    metavar="HOST=HW",
    help="make one host other hardware (repeatable; " + ", ".join(layout.HARDWARE) + ")",
)
@click.option(
    "--base",
    default=DEFAULT_SUITE,
    show_default=True,
    metavar="|".join(SUITES),
    help="every host's Debian base: bookworm (glibc 2.36, Python 3.11) or trixie (glibc 2.41, "
    "Python 3.13)",
)
@click.option(
    "--odd-base",
    "odd_base",
    multiple=True,
    metavar="HOST=BASE",
    help="give one host another Debian base (repeatable), e.g. lab2=trixie",
)
@click.option(
    "--compile-seconds",
    default=layout.DEFAULT_COMPILE_SECONDS,
    show_default=True,
    type=float,
    help="how long the simulated vllm compiles",
)
@click.option(
    "--models",
    multiple=True,
    metavar="ORG/NAME[,ORG/NAME...]",
    help="also put simulated snapshots of these models in the model store (repeatable)",
)
@click.option(
    "--offline",
    "offline",
    multiple=True,
    metavar="HOST",
    help="make a host offline: no lab server (index, apt, files) answers it; SSH to it works "
    "(repeatable)",
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="GROUP=HOST",
    help="also put a host in an inventory group (repeatable), e.g. router=lab3 (serve_router = "
    "fleet: it runs a router only) or prefill=lab1 (serve_roles)",
)
@_one_line_errors
def up(
    hosts: int,
    devices: int,
    odd_sku: tuple[str, ...],
    hardware: str,
    odd_hardware: tuple[str, ...],
    base: str,
    odd_base: tuple[str, ...],
    compile_seconds: float,
    models: tuple[str, ...],
    offline: tuple[str, ...],
    groups: tuple[str, ...],
) -> None:
    """Clear any earlier lab, then start hosts and package servers.

    A GPU host (h200, h100) has its NVIDIA driver installed (nvidia-smi) and no NPU; --devices
    and --odd-sku are for the RBLN hosts (cr13). A trixie host has glibc 2.41 (the upstream
    vLLM CPU wheel needs 2.39), a bookworm host 2.36. The model store holds a simulated snapshot of
    every model the shipped recipes name (drafts included) and of each --models id.
    """
    from servefleet.fleet.lab import fleet

    state = fleet.up(
        hosts,
        devices,
        _per_host(odd_sku),
        compile_seconds,
        log=lambda line: click.echo(line, err=True),
        models=[m.strip() for value in models for m in value.split(",") if m.strip()],
        hardware=hardware,
        odd_hardware=_per_host(odd_hardware, "HW", "lab2=h100"),
        offline=offline,
        base=base,
        odd_base=_per_host(odd_base, "BASE", "lab2=trixie"),
        groups=_groups(groups),
    )
    for host in state["hosts"]:
        note = " (offline)" if host["name"] in state["offline"] else ""
        click.echo(f"{host['name']} {host['address']} {host['sku']} running{note}{base_note(host)}")
    click.echo(
        f'lab up: state in {layout.STATE_FILE}; `eval "$(servefleet lab env)"` '
        "exports the lab credentials"
    )


@lab.command()
@_one_line_errors
def down() -> None:
    """Stop everything of the lab: hosts, servers, mounts, namespaces, bridge."""
    from servefleet.fleet.lab import teardown

    teardown.down()
    click.echo("lab down")


@lab.command()
@_one_line_errors
def status() -> None:
    """Hosts with address and state; servers up or down."""
    from servefleet.fleet.lab import fleet

    for line in fleet.status():
        click.echo(line)


@lab.command()
@_one_line_errors
def env() -> None:
    """Shell lines exporting the lab credentials: eval "$(servefleet lab env)"."""
    from servefleet.fleet.lab.state import env_lines, load_state

    for line in env_lines(load_state()):
        click.echo(line)


@lab.command("models")
@_one_line_errors
def list_models() -> None:
    """What the lab's model store serves: model, revision and sha256 of each archive."""
    from servefleet.fleet.lab.servers import store_models
    from servefleet.fleet.lab.state import load_state

    entries = store_models(load_state())
    width = max(map(len, entries), default=0)
    for model, entry in sorted(entries.items()):
        click.echo(f"{model:<{width}}  {entry['revision']}  {entry['sha256']}")


@lab.command(context_settings={"ignore_unknown_options": True})
@click.argument("host")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_one_line_errors
def ssh(host: str, command: tuple[str, ...]) -> None:
    """Open a shell on a lab host, or run COMMAND there."""
    from servefleet.fleet.lab.hosts import ssh_command
    from servefleet.fleet.lab.state import load_state

    argv = ssh_command(load_state(), host, list(command))
    if not command:
        argv.insert(1, "-t")
    os.execvp(argv[0], argv)


@lab.command()
@click.argument("spec", metavar="NAME==VERSION")
@click.option(
    "--index",
    metavar="|".join(layout.INDEXES),
    help="the index to republish on (default: the package's owner, else public)",
)
@_one_line_errors
def republish(spec: str, index: str | None) -> None:
    """Serve other bytes under the same file name and version on a lab index.

    The file(s) of NAME==VERSION on the index that owns the package (the lab's pip_indexes),
    else on the public index, get one more module (still installable); the index serves their
    new sha256 at once. The build cache is never changed; the next `lab up` starts pristine.
    """
    from servefleet.fleet.lab.republish import check_index, parse_spec, republish as republish_files
    from servefleet.fleet.lab.state import load_state

    parse_spec(spec)  # a bad argument is an error whether or not the lab is up
    check_index(index)
    for entry in republish_files(load_state(), spec, index):
        click.echo(
            f"republished {entry['file']} on the {entry['index']} index: "
            f"sha256 {entry['old_sha256']} -> {entry['new_sha256']}"
        )


@lab.command("offline")
@click.argument("hosts", nargs=-1, required=True, metavar="HOST...")
@click.option("--undo", is_flag=True, help="bring the hosts back online")
@_one_line_errors
def offline_hosts(hosts: tuple[str, ...], undo: bool) -> None:
    """Cut hosts off the lab's servers (indexes, apt, files); SSH to them keeps working.

    Their new connections to the bridge address are rejected (nftables in their network
    namespace); `lab status` shows them, `lab up` starts every host online.
    """
    from servefleet.fleet.lab.offline import offline
    from servefleet.fleet.lab.state import load_state

    now = offline(load_state(), hosts, undo)
    click.echo(f"offline: {', '.join(now) or 'none'}")
