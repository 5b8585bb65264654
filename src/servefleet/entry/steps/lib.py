"""serve_root's directories, the host programs (``remote/``), the servers' path guard
(``remote/asgi/``) and, only when the host cannot take
uv from its wheel itself (no public index named, ``servefleet.release.uvbin``), the uv binary:
root-owned, never the serve user's. Every other step runs the programs this one uploads."""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from pyinfra.operations import files, server

from servefleet.base.remote import REMOTE
from servefleet.base.remote.layout import ASGI, LIB, PATH_GUARD_MODULE, PLANS, RELEASES
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
    stale = {}
    for script in REMOTE_SCRIPTS:
        data = (REMOTE / script).read_bytes()
        dest = f"{plan.lib}/{script}"
        if not plan.has(dest, "file", "644", sha256=hashlib.sha256(data).hexdigest()):
            stale[script] = data
    if len(stale) == 1:
        ((script, data),) = stale.items()
        ensure.upload(plan, f"Upload {script}", data, f"{plan.lib}/{script}")
    elif stale:  # one upload and one command, not one operation a program (a first deploy: 18)
        programs(plan, stale)
    # the servers' path guard: a directory of its own, on their PYTHONPATH (instance_unit.py)
    ensure.directory(plan, f"{plan.lib}/{ASGI}")
    guard = f"{PATH_GUARD_MODULE}.py"
    ensure.upload(plan, f"Upload {guard} (the servers' path guard)",
                  (REMOTE / ASGI / guard).read_bytes(), f"{plan.lib}/{ASGI}/{guard}")  # fmt: skip
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


BUNDLE = ".programs.tar"  # in lib/: the host programs on their way, unpacked and renamed in
UNPACKED = ".programs.new"


def bundle(scripts: dict[str, bytes]) -> bytes:
    """``scripts`` (name -> bytes) as one tar, the same bytes for the same files: root's, 0644,
    mtime 0.

    + scripts: the host programs to send
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(scripts.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def programs(plan: HostPlan, stale: dict[str, bytes]) -> None:
    """The host programs that differ on the host, sent as one tar and unpacked beside them, each
    renamed into place (a program is the old file or the new one, never part of either; a run
    that dies in between sends them again). lib/ is root's: nothing else writes there."""
    files.put(
        name=f"Upload the host programs ({len(stale)}: {', '.join(sorted(stale))})",
        src=io.BytesIO(bundle(stale)),
        dest=f"{plan.lib}/{BUNDLE}",
        user="root",
        group="root",
        mode="600",
    )
    server.shell(name="Put the host programs in place", commands=[unpack_command(plan.lib)])


def unpack_command(lib_dir: str) -> str:
    """The shell command that unpacks :data:`BUNDLE` in ``lib_dir`` and renames each program
    into place.

    + lib_dir: ``<serve_root>/lib``
    """
    lib = shlex.quote(lib_dir)
    tar, new = shlex.quote(f"{lib_dir}/{BUNDLE}"), shlex.quote(f"{lib_dir}/{UNPACKED}")
    return (
        f"rm -rf {new} && mkdir -m 700 {new} && "
        f"tar -x --no-same-owner --no-same-permissions -f {tar} -C {new} && "
        f'chmod 644 {new}/* && for f in {new}/*; do mv -f "$f" {lib}/; done && '
        f"rmdir {new} && rm -f {tar}"
    )


T = TypeVar("T")
_PER_RUN: weakref.WeakKeyDictionary[Any, dict[type, Any]] = weakref.WeakKeyDictionary()


def per_run(state: Any, kind: type[T], make: Callable[[Any], T]) -> T:
    """The one ``kind`` of the pyinfra run ``state`` (what its hosts join while they are
    planned, for operations that decide when they run), made on first use from the run's state;
    gone with the run.

    + state: pyinfra's State
    + kind: the class of what is kept
    + make: builds it from the state
    """
    kept = _PER_RUN.setdefault(state, {})
    if kind not in kept:
        kept[kind] = make(state)
    found: T = kept[kind]
    return found
