"""Hand-made change detection: each operation here is added only when the probe found its
target differing (type, mode, owner, sha256), so a run with nothing to change costs one remote
command per host (the probe). Every path a step ensures this way is one the probe watches
(:func:`servefleet.hostplan.probe_input.watched_paths`)."""

from __future__ import annotations

import hashlib
from io import BytesIO

from pyinfra.operations import files

from servefleet.entry.steps.operations import put_secret
from servefleet.hostplan.types import HostPlan


def directory(plan: HostPlan, path: str, mode: str = "755", user: str = "root") -> None:
    if not plan.has(path, "dir", mode, user):
        files.directory(name=f"Create {path} ({mode})", path=path, user=user, group=user, mode=mode)


def upload(plan: HostPlan, name: str, data: bytes, dest: str) -> bool:
    """A root-owned 0644 file holding ``data``; whether it was not (an operation writes it)."""
    if plan.has(dest, "file", "644", sha256=hashlib.sha256(data).hexdigest()):
        return False
    files.put(name=name, src=BytesIO(data), dest=dest, user="root", group="root", mode="644")
    return True


def secret(plan: HostPlan, name: str, dest: str, value: str) -> bool:
    """A 0600 file holding ``value`` (and a newline), sent on stdin, never shown; whether it
    was not (an operation writes it)."""
    line = value if value.endswith("\n") else value + "\n"
    if plan.has(dest, "file", "600", sha256=plan.digest(dest, line.encode())):
        return False
    put_secret(name=name, dest=dest, secret=line)
    return True
