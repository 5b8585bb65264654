"""The vLLM version seam: what servefleet knows of one vLLM release, as data shipped with the
product (``servefleet/reference/vllm/<version>/``, one directory a release), and the one place
that reads it.

A version's directory holds the files generated from its real wheels (the ``vllm serve`` flag
tables and config schemas, upstream and with each vllm-rbln release's overlay; the ``VLLM_*``
variables; the Prometheus metrics; the HTTP routes and which of them the API key guards; the
reasoning and tool-call parser registries; the chat templates the wheel ships) and
``reference.json``, which names each file by what it is and holds the facts of the release that
servefleet relies on (the ports a serving group's ranks listen on for each other). A new vLLM
release is a new directory of data: no code here names one.

:func:`reference` gives a version's :class:`Reference` (by default :data:`DEFAULT`, the one every
caller uses until it is given its release's pin); :func:`version_of` maps a release's pins to
the version whose data it takes, refusing in one line one that has none. Pure (reads its files
only).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from servefleet.base.errors import DataError
from servefleet.base.shipped import VLLM_REFERENCE_DIR

MANIFEST = "reference.json"  # in each version's directory: its files by what they are, its facts
# The version servefleet was built on: what every caller reads until it is given its release's
# pin (issue #48 wires the pins); its directory must exist (a test holds it)
DEFAULT = "0.30.0"


@dataclass(frozen=True)
class TableFiles:
    """One ``vllm serve`` flag table of a version (a kind's ``flag_table``: ``upstream``, vLLM
    alone; ``rbln``, with the vllm-rbln plugin).

    + shown: how messages name it (``vLLM X`` or ``vLLM X with vllm-rbln Y``)
    + flags: the dump of the real parser's argparse actions
    + configs: the JSON schemas of its config classes (the flags that take a JSON object)
    + env_groups: the groups of the envs file whose ``VLLM_*`` variables its servers know
    """

    shown: str
    flags: Path
    configs: Path
    env_groups: tuple[str, ...]


@dataclass(frozen=True)
class Route:
    """One HTTP route of vLLM's OpenAI API server app.

    + path: as the app routes it
    + methods: its methods (``*``: a mount, any method)
    + guarded: ``--api-key`` guards it (vLLM's AuthenticationMiddleware answers 401 without it)
    """

    path: str
    methods: tuple[str, ...]
    guarded: bool


@dataclass(frozen=True)
class Reference:
    """What servefleet knows of one vLLM release.

    + version: the release (``X.Y.Z``, its directory's name)
    + root: its directory
    + tables: flag table name -> its files
    + envs: the ``VLLM_*`` variables vLLM (and vllm-rbln) know, by group
    + metrics: every Prometheus metric its stat logger declares
    + routes_file: the API server's routes and the key's guarded prefixes
    + parsers: the reasoning and tool-call parser registries, per table
    + chat_templates: the chat templates the wheel ships, one file name a line
    + rendezvous_ports: the ports a serving group's ranks listen on for each other: the flag
      that moves each (``""``: none) -> its default
    + guarded_prefixes: the paths ``--api-key`` guards start with
    + routes: the API server's routes
    """

    version: str
    root: Path
    tables: Mapping[str, TableFiles]
    envs: Path
    metrics: Path
    routes_file: Path
    parsers: Path
    chat_templates: Path
    rendezvous_ports: Mapping[str, int]
    guarded_prefixes: tuple[str, ...]
    routes: tuple[Route, ...]

    @property
    def shown(self) -> str:
        """How messages name this release: ``vLLM X.Y.Z``."""
        return f"vLLM {self.version}"

    def files(self) -> tuple[Path, ...]:
        """Every data file the manifest names, sorted by name (what a simulated wheel carries)."""
        named = {self.envs, self.metrics, self.routes_file, self.parsers, self.chat_templates}
        for table in self.tables.values():
            named |= {table.flags, table.configs}
        return tuple(sorted(named, key=lambda p: p.name))

    def key_guards(self, path: str) -> bool:
        """Whether ``--api-key`` guards a request for ``path`` (vLLM's check: the path starts
        with one of the guarded prefixes).

        + path: the request's path
        """
        return path.startswith(self.guarded_prefixes)


def known() -> tuple[str, ...]:
    """The versions servefleet has reference data for, oldest first."""
    found = [p.name for p in VLLM_REFERENCE_DIR.iterdir() if (p / MANIFEST).is_file()]
    return tuple(sorted(found, key=Version))


def _file(root: Path, name: object, what: str) -> Path:
    path = root / str(name)
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise DataError(f"{root / MANIFEST}: {what} names {name!r}, not a file beside it")
    return path


@functools.cache
def reference(version: str = DEFAULT) -> Reference:
    """The reference data of vLLM ``version``; DataError, in one line naming the known versions,
    when servefleet has none.

    + version: ``X.Y.Z`` (a directory under ``reference/vllm``)
    """
    if version not in known():
        raise DataError(
            f"servefleet has no reference data for vLLM {version} (known: {', '.join(known())})"
        )
    root = VLLM_REFERENCE_DIR / version
    data: dict[str, Any] = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    if data.get("vllm") != version:
        raise DataError(f"{root / MANIFEST}: names vLLM {data.get('vllm')!r}, not {version}")
    tables = {
        name: TableFiles(
            str(t["shown"]),
            _file(root, t["flags"], f"table {name}'s flags"),
            _file(root, t["configs"], f"table {name}'s configs"),
            tuple(t["env_groups"]),
        )
        for name, t in data["tables"].items()
    }
    routes_file = _file(root, data["routes"], "routes")
    served = json.loads(routes_file.read_text(encoding="utf-8"))
    routes = tuple(
        Route(r["path"], tuple(r["methods"]), bool(r["guarded"])) for r in served["routes"]
    )
    ports = {str(p["flag"] or ""): int(p["default"]) for p in data["rendezvous_ports"]}
    return Reference(
        version=version,
        root=root,
        tables=tables,
        envs=_file(root, data["envs"], "envs"),
        metrics=_file(root, data["metrics"], "metrics"),
        routes_file=routes_file,
        parsers=_file(root, data["parsers"], "parsers"),
        chat_templates=_file(root, data["chat_templates"], "chat_templates"),
        rendezvous_ports=ports,
        guarded_prefixes=tuple(served["guarded_prefixes"]),
        routes=routes,
    )


def version_of(pins: Mapping[str, str]) -> str:
    """The version whose reference data a release with ``pins`` takes: its ``vllm`` pin, without
    a local part (``0.30.0+cpu``: ``0.30.0``), equal to a known version; DataError in one line
    naming the pin and the known versions otherwise.

    + pins: canonical package name -> pinned version (a Settings' ``sdk_pins``)
    """
    have = ", ".join(known())
    pin = pins.get("vllm")
    if pin is None:
        raise DataError(
            "sdk_pins: no vllm pin, so no vLLM version to check against; allowed: vllm==X "
            f"with X one servefleet has reference data for ({have})"
        )
    try:
        wanted = Version(pin)
    except InvalidVersion:
        raise DataError(f"sdk_pins: vllm=={pin} is not a version") from None
    for version in known():
        if Version(version) == Version(wanted.public):
            return version
    raise DataError(
        f"sdk_pins: vllm=={pin}: servefleet has no reference data for vLLM {wanted.public} "
        f"(known: {have})"
    )
