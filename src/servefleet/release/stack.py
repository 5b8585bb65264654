"""A *stack*: the set of packages one selection installs (the SDK pins, the extras and extra
packages it needs, the indexes that own them), and the throw-away uv project it is resolved as.

Every owned package comes only from its owner: the owners' indexes are uv *explicit* indexes,
each owned package pinned to its own, and every other package comes from the public index. A
package that is not owned but that an owner's index serves too is refused: the data must say
whose it is. Credentials reach uv in its environment only (:func:`credentials_env`).

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servefleet.base.errors import ServefleetError

ENVIRONMENT = "sys_platform == 'linux' and platform_machine == 'x86_64'"  # the hosts a lock is for


class LockError(ServefleetError):
    """A lock that cannot be made, read or used (one line)."""


@dataclass(frozen=True, eq=True)
class Stack:
    """What one lock entry is made from (JSON-able ``inputs``; ``name`` is for people).

    + name: ``rbln``, ``rbln-kv-connectors-arctic-inference``, ``gpu``: platform, extras, extras
    + inputs: requirements, constraints, owner indexes, public index, python, trusted hosts
    """

    name: str
    inputs: dict[str, Any]

    def __hash__(self) -> int:
        return hash((self.name, self.digest))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs, sort_keys=True).encode()).hexdigest()

    def owners(self) -> dict[str, str]:
        """Owned package -> owner index name."""
        return {p: i["name"] for i in self.inputs["indexes"] for p in i["packages"]}


def stack(
    name: str,
    requirements: Iterable[str],
    constraints: Iterable[str],
    indexes: Iterable[Mapping[str, Any]],
    public_index: str | None,
    python: str,
    trusted_hosts: Iterable[str],
) -> Stack:
    """A Stack from a release's parts (see :func:`servefleet.release.plan.stack_for`).

    + name: the stack's readable name
    + requirements: what is installed (owned pins, the top package, extra packages)
    + constraints: pins of public packages
    + indexes: ``{"name", "url", "packages", "auth"}`` of each owner index this stack uses
    + public_index: every other package's index (None: uv's default)
    + python: the Python versions the lock resolves for (a specifier, ``>=3.10``)
    + trusted_hosts: hosts reached over plain http
    """
    return Stack(
        name,
        {
            "requirements": sorted(requirements),
            "constraints": sorted(constraints),
            "indexes": sorted(
                (
                    {
                        "name": i["name"],
                        "url": i["url"].rstrip("/"),
                        "packages": sorted(i["packages"]),
                        "auth": bool(i["auth"]),
                    }
                    for i in indexes
                ),
                key=lambda i: i["name"],
            ),
            "public_index": public_index.rstrip("/") if public_index else None,
            "python": python,
            "trusted_hosts": sorted(trusted_hosts),
        },
    )


# ---------------------------------------------------------------------------------------------
# Resolving (controller, uv)


def _toml(value: Any) -> str:
    """A TOML value for strings, bools, lists and inline tables (JSON strings are TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def project_toml(st: Stack, metadata: Iterable[Mapping[str, Any]] = ()) -> str:
    """The throw-away uv project a stack is resolved as.

    + st: the stack
    + metadata: ``[[tool.uv.dependency-metadata]]`` entries (of sdists built for it)
    """
    inp = st.inputs
    lines = [
        "[project]",
        'name = "servefleet-stack"',
        'version = "0"',
        f"requires-python = {_toml(inp['python'])}",
        f"dependencies = {_toml(inp['requirements'])}",
        "",
        "[tool.uv]",
        "package = false",
        f"constraint-dependencies = {_toml(inp['constraints'])}",
        f"environments = {_toml([ENVIRONMENT])}",
        f"allow-insecure-host = {_toml(inp['trusted_hosts'])}",
    ]
    for index in inp["indexes"]:
        lines += ["", "[[tool.uv.index]]", f"name = {_toml(index['name'])}"]
        lines += [f"url = {_toml(index['url'])}", "explicit = true"]
    if inp["public_index"]:
        lines += ["", "[[tool.uv.index]]", 'name = "public"', f"url = {_toml(inp['public_index'])}"]
        lines += ["default = true"]
    for meta in metadata:
        lines += ["", "[[tool.uv.dependency-metadata]]"]
        lines += [f"{k} = {_toml(v)}" for k, v in sorted(meta.items())]
    lines += ["", "[tool.uv.sources]"]
    lines += [f"{pkg} = {_toml({'index': owner})}" for pkg, owner in sorted(st.owners().items())]
    return "\n".join(lines) + "\n"


def index_env(name: str) -> str:
    """uv's variable prefix for an index's credentials (``UV_INDEX_<NAME>_``).

    + name: the index name
    """
    return "UV_INDEX_" + "".join(c if c.isalnum() else "_" for c in name).upper() + "_"


def credentials_env(st: Stack, user: str | None, password: str | None) -> dict[str, str]:
    """uv's environment variables holding the credentials of the stack's indexes with ``auth``
    (credentials reach uv only this way, never in argv).

    + st: the stack
    + user, password: the index credentials (LockError when an index needs them and they lack)
    """
    env: dict[str, str] = {}
    for index in st.inputs["indexes"]:
        if index["auth"]:
            if not (user and password):
                raise LockError(f"the {index['name']} index needs credentials; none are set")
            env[index_env(index["name"]) + "USERNAME"] = user
            env[index_env(index["name"]) + "PASSWORD"] = password
    return env


def basic_auth(user: str, password: str) -> dict[str, str]:
    """The HTTP Basic ``Authorization`` header for an index's credentials.

    + user, password: the credentials
    """
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}
