"""serve_root's directories, the host programs (``remote/``) and, only when the host cannot take
uv from its wheel itself (no public index named, ``servefleet.release.uvbin``), the uv binary:
root-owned, never the serve user's. Every other step runs the programs this one uploads."""

from __future__ import annotations

import shlex
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from pyinfra.operations import files

from servefleet.base.remote import REMOTE
from servefleet.base.remote.layout import LIB, PLANS, RELEASES
from servefleet.entry.steps import ensure
from servefleet.hostplan.probe_input import REMOTE_SCRIPTS
from servefleet.hostplan.types import HostPlan
from servefleet.release.uvbin import uv_binary


def command(root: str, program: str, *args: str) -> str:
    """The shell command that runs the host program ``program`` from ``<root>/lib``."""
    return shlex.join(["python3", f"{root}/{LIB}/{program}", *args])


def upload(plan: HostPlan) -> None:
    s = plan.settings
    for path in (
        s.serve_root,
        plan.lib,
        f"{s.serve_root}/{PLANS}",
        f"{s.serve_root}/{RELEASES}",
        plan.state_dir,
    ):
        ensure.directory(plan, path)
    for script in REMOTE_SCRIPTS:
        data = (REMOTE / script).read_bytes()
        ensure.upload(plan, f"Upload {script}", data, f"{plan.lib}/{script}")
    uv = plan.release.uv
    found = plan.paths.get(uv or "") or {}
    if plan.release.uv_wheel:  # install_release.py takes it from the wheel, by its sha256
        return
    if uv and (found.get("type"), found.get("mode"), found.get("user")) != ("file", "755", "root"):
        files.put(
            name=f"Upload uv {uv.rsplit('-', 1)[-1]} (the release installer)",
            src=str(uv_binary()),
            dest=uv,
            user="root",
            group="root",
            mode="755",
        )


T = TypeVar("T")
_PER_RUN: weakref.WeakKeyDictionary[Any, dict[type, Any]] = weakref.WeakKeyDictionary()


def per_run(state: Any, kind: type[T], make: Callable[[list[str]], T]) -> T:
    """The one ``kind`` of the pyinfra run ``state`` (what its hosts join while they are
    planned, for operations that decide when they run), made on first use from the run's host
    names in inventory order; gone with the run.

    + state: pyinfra's State
    + kind: the class of what is kept
    + make: builds it from the host names
    """
    kept = _PER_RUN.setdefault(state, {})
    if kind not in kept:
        kept[kind] = make([h.name for h in state.inventory])
    found: T = kept[kind]
    return found
