"""Reading an operator's inventory on the controller, with pyinfra's own loader
(``pyinfra_cli.inventory.make_inventory``): an inventory file with its group data, ``h1,h2``,
``@connector`` names, a module attribute. Every fleet command (``plan``, ``status``,
``rollout``, ``rollback``, ``lock``, ``monitoring``, ``wheelhouse``) reads it here, and picks
hosts with pyinfra's ``--limit`` / ``--exclude`` semantics (a group name, else a glob of host
names).

Whatever the file raises (a NameError, ``SystemExit('the lab is not up')``, a syntax error)
becomes one line naming the file (a group data file's error: that file and its line), never a
traceback. Before any host is contacted the inventory's form is checked (no Ansible INI or
YAML file, no empty name in a host list, a missing file named as missing) and each host's name,
``ssh_hostname`` and ``ssh_port`` (:func:`check_host_name`, :func:`check_ssh_data`: the
deploys' data check runs them too).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.base.errors import DataError, ServefleetError
from servefleet.settings.table import Settings, settings_from

# pyinfra's options whose values pick hosts (the rollout takes them out of what it passes on)
_PICK_OPTIONS = ("--limit", "--exclude")
# pyinfra's options that are data overrides, as pyinfra's CLI turns them into data
_SSH_OPTIONS = ("ssh_user", "ssh_key", "ssh_key_password", "ssh_port", "ssh_password")


# what a host name or address may hold: a DNS name, an IPv4 or IPv6 address; a connector name
# (@local, @docker/debian:12, @ssh/h1) also / + @
_HOST_NAME = re.compile(r"[A-Za-z0-9._:-]+")
_CONNECTOR_NAME = re.compile(r"@[A-Za-z0-9._:/@+-]*")
HOST_CHARACTERS = "letters, digits and . - _ : (an @connector name also / + @)"
INVENTORY_FORMS = (
    "a pyinfra Python inventory file (inventories/prod.py), a host list h1,h2 (no name empty), "
    "@connector names or a module.attribute"
)
# an inventory file in one of these formats is not Python: pyinfra would run it as Python
_NOT_PYTHON = (".ini", ".yml", ".yaml", ".json", ".toml", ".cfg")


def check_host_name(name: Any) -> None:
    """Refuse, in one line, a host name with a character no host name or address has (pyinfra
    would connect to something else than meant).

    + name: the host's inventory name
    """
    pattern = _CONNECTOR_NAME if isinstance(name, str) and name.startswith("@") else _HOST_NAME
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise DataError(
            f"host {name!r}: not a host name or address; allowed characters: {HOST_CHARACTERS}"
        )


def check_ssh_data(data: Mapping[str, Any]) -> None:
    """Refuse, in one line, an ``ssh_hostname`` with a character no host name or address has,
    and an ``ssh_port`` outside 1-65535 (pyinfra's socket would wrap 70000 round to 4464).

    + data: a host's data
    """
    address = data.get("ssh_hostname")
    if address is not None and not (isinstance(address, str) and _HOST_NAME.fullmatch(address)):
        raise DataError(
            f"ssh_hostname {address!r}: not a host name or address; allowed characters: "
            f"{HOST_CHARACTERS}"
        )
    port = data.get("ssh_port")
    if port is None:
        return
    number = port if isinstance(port, int) and not isinstance(port, bool) else None
    if isinstance(port, str) and port.isascii() and port.isdigit():
        number = int(port)
    if number is None or not 1 <= number <= 65535:
        raise DataError(f"ssh_port {port!r}: not a port; allowed: 1-65535")


def _check_form(inventory: str) -> None:
    """Refuse, before pyinfra reads it, an inventory pyinfra cannot take: a file that is not
    Python (an Ansible INI or YAML inventory), a host list with an empty name (``h1,``)."""
    path = Path(inventory)
    if path.is_file():
        if path.suffix.lower() in _NOT_PYTHON or (path.suffix != ".py" and not _python(path)):
            raise ServefleetError(
                f"{inventory}: not a pyinfra inventory (an Ansible INI or YAML inventory is not "
                f"supported); allowed: {INVENTORY_FORMS}"
            )
    elif not path.exists() and "," in inventory:
        if any(not name.strip() for name in inventory.split(",")):
            raise ServefleetError(
                f"{inventory}: an empty host name in the host list; allowed: {INVENTORY_FORMS}"
            )


# an INI section header alone on a line (``[cr13]``, ``[all:vars]``): Python, but no inventory's
_INI_SECTION = re.compile(rb"^[ \t]*\[[A-Za-z0-9_.:-]+\][ \t]*\r?$", re.MULTILINE)


def _python(path: Path) -> bool:
    """Whether a file without the ``.py`` suffix reads as a Python inventory: it compiles and
    has no INI section header line (Ansible's ``hosts``)."""
    try:
        text = path.read_bytes()
        compile(text, str(path), "exec")
    except (SyntaxError, ValueError):
        return False
    except OSError:
        return True  # pyinfra's own read says what is wrong
    return not _INI_SECTION.search(text)


def _looks_like_file(inventory: str) -> bool:
    return "/" in inventory or Path(inventory).suffix.lower() in (".py", *_NOT_PYTHON)


def _shown(filename: str) -> str:
    """A file as the operator would name it: relative to the working directory when under it."""
    rel = os.path.relpath(filename)
    return filename if rel.startswith("..") else rel


def inventory_error(path: str, e: BaseException) -> ServefleetError:
    """One line for an exception an inventory file raised while it was read: a group data
    file's own error names that file and its line.

    + path: the inventory file
    + e: what reading it raised (pyinfra wraps the file's own exception)
    """
    if isinstance(e, SystemExit):
        return ServefleetError(str(e.code))
    inner: Any = getattr(e, "exception", None) or e  # pyinfra's UnexpectedExternalError
    try:
        said = str(e.msg if isinstance(e, SyntaxError) else inner)  # its line said apart
    except Exception:  # noqa: BLE001 (an exception whose str() fails: name its type)
        said = ""
    said = " ".join(said.split()) or type(inner).__name__
    # the file pyinfra was running: it wraps what running one raised, a syntax error is bare
    where = getattr(e, "filename", None) if inner is not e or isinstance(e, SyntaxError) else None
    kind = type(inner).__name__
    if not isinstance(where, str) or os.path.abspath(where) == os.path.abspath(path):
        if isinstance(inner, SyntaxError):  # with its line: (inv.py, line 2)
            said = " ".join(str(inner).split())
        return ServefleetError(f"{path}: cannot read the inventory: {kind}: {said}")
    import traceback

    lines = [f.lineno for f in traceback.extract_tb(inner.__traceback__) if f.filename == where]
    line = e.lineno if isinstance(e, SyntaxError) else (lines[-1] if lines else None)
    at = f", line {line}" if line else ""
    return ServefleetError(f"{_shown(where)}{at}: cannot read the group data: {kind}: {said}")


def pyinfra_cli() -> Any:
    """The ``pyinfra_cli`` package, imported without the gevent patching of the standard
    library its ``__init__`` does: this process only reads inventories with it and runs pyinfra
    as processes of their own, and its threads (the rollout's ticker) and subprocesses stay the
    standard library's. Its logger gets a handler that drops its warnings (this process says
    what is wrong itself, in one line); a handler the process has already set still sees them."""
    if "pyinfra_cli" not in sys.modules:
        from gevent import monkey

        patch = monkey.patch_all
        monkey.patch_all = lambda *args, **kwargs: None  # type: ignore[assignment]
        try:
            import pyinfra_cli  # noqa: F401 (its __init__ would patch the standard library)
        finally:
            monkey.patch_all = patch  # type: ignore[assignment]
    import pyinfra_cli.cli  # noqa: F401 (the submodules are reached as attributes)
    import pyinfra_cli.inventory  # noqa: F401
    import pyinfra_cli.util  # noqa: F401

    logger = logging.getLogger("pyinfra")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    return sys.modules["pyinfra_cli"]


def data_overrides(
    items: Sequence[str], option: str = "--data", parse: bool = True
) -> dict[str, Any]:
    """``KEY=VALUE`` options as a dict, each value as pyinfra reads ``--data`` (``true``,
    numbers, JSON lists and objects), or as the string given (``parse=False``).

    + items: the options' values
    + option: the option's name, for the error
    + parse: read values as pyinfra does
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise ServefleetError(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = pyinfra_cli().util.parse_cli_arg(value) if parse else value
    return out


def command_overrides(
    data: Sequence[str], selection: Sequence[str] = (), selected: Any = None
) -> dict[str, Any]:
    """A fleet command's ``--data KEY=VALUE`` (read as pyinfra reads ``--data``) and
    ``--selection AXIS=VALUE`` (strings) as data over everything: the selection is
    ``serve_selection`` on every host, in place of the data's, with the axes of a
    ``--data serve_selection=...`` it does not name.

    + data, selection: the options' values
    + selected: a ``serve_selection`` given after ``--`` (pyinfra's ``--data``)
    """
    out = data_overrides(data)
    if selection:
        chosen = data_overrides(selection, "--selection", parse=False)
        base = out.get("serve_selection", selected) or {}
        if not isinstance(base, dict):
            raise ServefleetError(
                f"--data serve_selection={base!r}: not a mapping, so --selection cannot add to "
                'it; allowed: a JSON object ({"lmcache": "cpu"}) or --selection alone'
            )
        out["serve_selection"] = {**base, **chosen}
    return out


@dataclass(frozen=True)
class PyinfraOptions:
    """What pyinfra's own command line parser reads from arguments passed on to pyinfra (after
    ``--``) that decides which hosts run and with which data.

    + limit, exclude: host, group or glob patterns (repeatable, as pyinfra's)
    + data: ``--data KEY=VALUE`` and pyinfra's ``--ssh-*`` options, as pyinfra makes them data
    + group_data: ``--group-data`` directories
    + rest: the arguments without their ``--limit`` and ``--exclude`` options
    """

    limit: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    group_data: tuple[str, ...] = ()
    rest: tuple[str, ...] = ()

    @classmethod
    def parse(cls, args: Sequence[str]) -> PyinfraOptions:
        """+ args: arguments for pyinfra (options only: no inventory, no operations)"""
        import click

        cli = pyinfra_cli().cli.cli
        given = [*args, "INVENTORY", "DEPLOY"]
        try:  # as pyinfra's own parse would: an option it does not know, a value missing
            cli.make_parser(click.Context(cli, info_name="pyinfra")).parse_args(list(given))
            ctx = cli.make_context("pyinfra", list(given), resilient_parsing=True)
        except click.UsageError as e:
            raise ServefleetError(
                f"pyinfra arguments {' '.join(args)}: {e.format_message()} (allowed after --: "
                "pyinfra's options, see pyinfra --help)"
            ) from None
        except Exception as e:  # noqa: BLE001 (click's own parse errors: one line)
            raise ServefleetError(f"pyinfra arguments {' '.join(args)}: {e}") from None
        params = ctx.params
        if params.get("inventory") != "INVENTORY":  # a word that is no option's value
            raise ServefleetError(
                f"pyinfra arguments {' '.join(args)}: {params.get('inventory')!r} is not an "
                "option (allowed after --: pyinfra's options, see pyinfra --help)"
            )
        data = data_overrides(params.get("data") or ())
        data.update({k: params[k] for k in _SSH_OPTIONS if params.get(k)})
        return cls(
            limit=tuple(params.get("limit") or ()),
            exclude=tuple(params.get("exclude") or ()),
            data=data,
            group_data=tuple(params.get("group_data") or ()),
            rest=tuple(_without_picks(args)),
        )


def _without_picks(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _PICK_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _PICK_OPTIONS)):
            out.append(arg)
    return out


@dataclass(frozen=True)
class InventoryHost:
    """One host as pyinfra reads it.

    + name: its inventory name
    + data: its whole data (override, host, groups, all), as ``host.data`` gives it
    """

    name: str
    data: Mapping[str, Any]

    @property
    def address(self) -> str:
        """Where it is reached from outside (``ssh_hostname``, else its name)."""
        return str(self.data.get("ssh_hostname") or self.name)


@dataclass(frozen=True)
class Fleet:
    """An inventory read by pyinfra's loader.

    + hosts: every host, in pyinfra's order (first appearance in the groups)
    + groups: each group's host names in that order (pyinfra's groups: the file's own, the
      group named after the file, and any a group data file names)
    """

    hosts: tuple[InventoryHost, ...]
    groups: Mapping[str, tuple[str, ...]]

    @property
    def order(self) -> list[str]:
        return [h.name for h in self.hosts]

    def host(self, name: str) -> InventoryHost:
        return next(h for h in self.hosts if h.name == name)

    def settings(
        self,
        names: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        recipe: bool = True,
    ) -> dict[str, Settings]:
        """Each host's data validated as the deploys validate it, checked whole before any
        pyinfra run: every key, and the recipe resolved with its selection and strategy as the
        deploy's plan resolves it. Every problem is one line naming the host (and how many more
        hosts share it), all of them at once (:class:`DataProblems`); no host is contacted.

        + names: these hosts (default: all)
        + environ: where credentials are read from (default: this process's environment)
        + recipe: also resolve the recipe (``rollback`` needs none: its hosts' kept states)
        """
        from servefleet.base.errors import DataProblems, RecipeError
        from servefleet.hostplan.extras import resolve_for

        out = {}
        problems: dict[str, list[str]] = {}  # the problem -> the hosts that have it
        for host in self.hosts if names is None else [self.host(n) for n in names]:
            try:
                s = settings_from(host.data.get, environ, keys=host.data.keys())
                if recipe:
                    try:
                        resolve_for(s)
                    except RecipeError as e:
                        raise RecipeError(f"serve_recipe/serve_selection: {e}") from None
            except ServefleetError as e:
                problems.setdefault(" ".join(str(e).split()), []).append(host.name)
                continue
            out[host.name] = s
        if problems:
            raise DataProblems(
                [f"{hosts[0]}: {why}{_also(hosts[1:])}" for why, hosts in problems.items()]
            )
        return out

    def matching(self, pattern: str) -> list[str]:
        """pyinfra's ``--limit``/``--exclude`` pattern: a group's hosts, else the hosts whose
        name the glob matches."""
        if pattern in self.groups:
            return list(self.groups[pattern])
        return [h for h in self.order if fnmatch.fnmatch(h, pattern)]

    def select(
        self, limit: Sequence[str] = (), exclude: Sequence[str] = (), warn: Any = None
    ) -> list[str]:
        """The hosts pyinfra runs with these ``--limit`` and ``--exclude`` patterns, in
        inventory order. A pattern that matches nothing is said through ``warn`` (as pyinfra
        warns); no host at all is an error.

        + limit: patterns (none: every host)
        + exclude: patterns
        + warn: called with a line for each pattern that matches no host
        """
        chosen: set[str] = set() if limit else set(self.order)
        unmatched = []
        for option, patterns in (("--limit", limit), ("--exclude", exclude)):
            for pattern in patterns:
                found = self.matching(pattern)
                if not found:
                    unmatched.append(f"{option} {pattern} matches no host of the inventory")
                chosen = chosen | set(found) if option == "--limit" else chosen - set(found)
        picked = [h for h in self.order if h in chosen]
        if limit and not picked and not any(self.matching(p) for p in limit):
            raise ServefleetError(f"--limit {' '.join(limit)} matches no host of the inventory")
        if not picked:
            raise ServefleetError(f"--exclude {' '.join(exclude)} leaves no host of the inventory")
        for line in unmatched if warn is not None else ():
            warn(line)
        return picked


def _also(rest: Sequence[str], shown: int = 2) -> str:
    """The other hosts that share a problem, after it: `` (also h2, h3)``, or `` (also h2, h3
    and 37 more hosts)``; nothing for none."""
    if not rest:
        return ""
    more = f" and {len(rest) - shown} more hosts" if len(rest) > shown + 1 else ""
    return f" (also {', '.join(rest[:shown] if more else rest)}{more})"


def limit_pattern(host: str) -> str:
    """A ``--limit`` pattern that matches this host name only (glob characters escaped)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in host)


def read_inventory(
    inventory: str,
    overrides: Mapping[str, Any] | None = None,
    group_data: Sequence[str] = (),
) -> Fleet:
    """Read an inventory as pyinfra does (no host is contacted): the hosts, their groups and
    their data with ``group_data/`` of the working directory and of the inventory's.

    + inventory: anything pyinfra takes as INVENTORY (a file, ``h1,h2``, ``@local``, ...)
    + overrides: data over everything (as ``pyinfra --data``)
    + group_data: more group data directories (as ``pyinfra --group-data``)
    """
    from pyinfra.api import State
    from pyinfra.context import ctx_state

    loader = pyinfra_cli().inventory
    _check_form(inventory)
    try:
        with ctx_state.use(State(check_for_changes=False)):
            inv = loader.make_inventory(
                inventory,
                override_data=dict(overrides or {}),
                cwd=os.getcwd(),
                group_data_directories=list(group_data) or None,
            )
            hosts = tuple(InventoryHost(h.name, h.data.dict()) for h in inv)
            groups = {name: tuple(h.name for h in members) for name, members in inv.groups.items()}
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the operator's file: any error is one line)
        raise inventory_error(inventory, e) from None
    if not hosts and _looks_like_file(inventory) and not os.path.lexists(inventory):
        raise ServefleetError(f"{inventory}: no such file; allowed: {INVENTORY_FORMS}")
    if not hosts:
        raise ServefleetError(
            f"{inventory}: no hosts (an inventory is a file, a comma-separated list of hosts, "
            "@connector names, a host name that resolves, or a module.attribute, as pyinfra reads it)"
        )
    for host in hosts:  # before any host is contacted
        check_host_name(host.name)
        try:
            check_ssh_data(host.data)
        except DataError as e:
            raise DataError(f"{host.name}: {e}") from None
    return Fleet(hosts, groups)


@dataclass(frozen=True)
class FleetArgs:
    """A fleet command's hosts and what it passes on to pyinfra.

    + fleet: the inventory as pyinfra reads it (with the data of ``--data``)
    + hosts: the hosts the command runs on, inventory order (``--limit`` given to the command
      and in the arguments for pyinfra, minus their ``--exclude``)
    + limit: the command's own ``--limit`` patterns
    + pyinfra: the arguments for pyinfra as given
    + options: what pyinfra reads from them
    """

    fleet: Fleet
    hosts: list[str]
    limit: tuple[str, ...]
    pyinfra: tuple[str, ...]
    options: PyinfraOptions

    data: tuple[str, ...] = ()

    @classmethod
    def read(
        cls,
        inventory: str,
        limit: Sequence[str],
        pyinfra_args: Sequence[str],
        warn: Any = None,
        data: Sequence[str] = (),
        selection: Sequence[str] = (),
    ) -> FleetArgs:
        """+ inventory: as pyinfra takes it
        + limit: the command's ``--limit`` patterns
        + pyinfra_args: arguments passed on to pyinfra (after ``--``)
        + warn: called with a line for a pattern that matches no host
        + data: the command's ``--data KEY=VALUE`` (over the data after ``--``)
        + selection: the command's ``--selection AXIS=VALUE`` (:func:`command_overrides`)"""
        options = PyinfraOptions.parse(pyinfra_args)
        ours = command_overrides(data, selection, options.data.get("serve_selection"))
        fleet = read_inventory(inventory, {**options.data, **ours}, options.group_data)
        hosts = fleet.select((*limit, *options.limit), options.exclude, warn)
        passed = [a for item in data for a in ("--data", item)]
        if "serve_selection" in ours and selection:
            passed += ["--data", "serve_selection=" + json.dumps(ours["serve_selection"])]
        return cls(fleet, hosts, tuple(limit), tuple(pyinfra_args), options, tuple(passed))

    def settings(
        self, environ: Mapping[str, str] | None = None, recipe: bool = True
    ) -> dict[str, Settings]:
        """Each of its hosts' data checked whole (:meth:`Fleet.settings`)."""
        return self.fleet.settings(self.hosts, environ, recipe)

    def limit_args(self) -> list[str]:
        """The command's ``--limit`` options, for a pyinfra run over its hosts."""
        return [a for pattern in self.limit for a in ("--limit", pattern)]

    def passed_on(self) -> list[str]:
        """What a pyinfra run over its hosts gets: the command's ``--limit``, the arguments after
        ``--``, then the command's ``--data`` and ``--selection`` as ``--data`` (the last
        ``--data`` of a key wins, as in pyinfra)."""
        return [*self.limit_args(), *self.pyinfra, *self.data]
