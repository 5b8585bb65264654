"""A host's kept states and what they keep. Runs ON THE HOST, as root, with the system python3
(stdlib only), next to ``instances.py``.

In ``serve_root/state``: ``good.json`` (the last state in which every instance was healthy),
``previous.json`` (the good one before it), the unit texts they name kept by sha in ``units/``,
and the lock that lets one converge, restore, rollback or re-check run at a time. Beside it,
``current`` (the serving release, pointed by rename) and the releases and kept units nothing
names any more, removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402  (next to this file on the host)
import systemd_units  # noqa: E402


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """One converge, restore, rollback or re-check at a time: a run whose controller died may
    still be at work here."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / layout.STATE_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_state(path: Path, state: dict[str, Any]) -> None:
    systemd_units.write_atomic(path, json.dumps(state, indent=1, sort_keys=True) + "\n")


def keep_units(state_dir: Path, state: dict[str, Any]) -> None:
    """Keep the unit texts of a good state by sha, for rollbacks."""
    store = state_dir / layout.KEPT_UNITS
    store.mkdir(parents=True, exist_ok=True)
    for inst in state["instances"]:
        target = store / f"{inst['sha']}.service"
        if not target.exists():
            systemd_units.write_atomic(target, inst["text"])


def record_good(state_dir: Path, state: dict[str, Any]) -> None:
    """``state`` is good now (without its texts and stale units); the good one before it
    becomes ``previous.json`` when it ran other units."""
    good = {k: v for k, v in state.items() if k != "stale"}
    good["instances"] = [{k: v for k, v in i.items() if k != "text"} for i in state["instances"]]
    old = load(state_dir / layout.GOOD)
    if old and [i["sha"] for i in old["instances"]] != [i["sha"] for i in good["instances"]]:
        write_state(state_dir / layout.PREVIOUS, old)
    write_state(state_dir / layout.GOOD, good)


def record_rollback(state_dir: Path, good: dict[str, Any], target: dict[str, Any]) -> None:
    """A rollback by hand to ``target`` (the previous state): it is good now, and ``good`` the
    previous one (a second rollback goes back to it)."""
    write_state(state_dir / layout.PREVIOUS, good)
    write_state(state_dir / layout.GOOD, target)


def point_current(root: Path, release: str) -> None:
    """``root/current`` -> ``releases/<release>``, by rename: never a moment without the link.
    Nothing is removed here (:func:`clean_up` removes what nothing names)."""
    link, target = root / layout.CURRENT, f"{layout.RELEASES}/{release}"
    if os.path.islink(link) and os.readlink(link) == target:
        return
    tmp = root / layout.CURRENT_NEW
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def released_in_units() -> set[str]:
    unit_dir = systemd_units.UNIT_DIR
    ids = set()
    for path in [*glob.glob(str(unit_dir / layout.UNIT_GLOB)), str(unit_dir / layout.ROUTER_UNIT)]:
        with contextlib.suppress(OSError):
            ids.update(re.findall(rf"/{layout.RELEASES}/([0-9a-f]+)/", Path(path).read_text()))
    return ids


def clean_up(state_dir: Path) -> None:
    """Remove releases and kept units nothing can need: keep ``current``, every release a unit
    on disk names, those of the good and previous states, and a drifted release set aside
    (``<id>.tampered-...``) for ``layout.TAMPERED_KEEP`` seconds."""
    root = state_dir.parent
    states = [s for s in (load(state_dir / layout.GOOD), load(state_dir / layout.PREVIOUS)) if s]
    keep = released_in_units() | {s["release"] for s in states}
    keep |= {s["router"]["release"] for s in states if s.get("router")}
    cur = root / layout.CURRENT
    if os.path.islink(cur):
        keep.add(os.path.basename(os.readlink(cur)))
    releases = root / layout.RELEASES
    for rel in sorted(releases.iterdir()) if releases.is_dir() else []:
        if layout.TAMPERED in rel.name and not _expired(rel):
            continue  # a drifted release set aside: kept for inspection a while
        if rel.name not in keep:
            shutil.rmtree(rel, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (root / layout.PLANS / f"{rel.name}.json").unlink()
            systemd_units.log(f"release {rel.name}: removed (no unit or state names it)")
    shas = {i["sha"] for s in states for i in s["instances"]}
    for kept in (state_dir / layout.KEPT_UNITS).glob("*.service"):
        if kept.stem not in shas:
            kept.unlink()


def _expired(path: Path) -> bool:
    """A set-aside release older than ``layout.TAMPERED_KEEP`` (by when it was set aside)."""
    try:
        return time.time() - path.lstat().st_ctime > layout.TAMPERED_KEEP
    except OSError:
        return False


def kept_instances(state_dir: Path, target: dict[str, Any]) -> list[dict[str, Any]]:
    """A kept state's instances with their unit texts from ``units/`` (by sha), to restore;
    Failed naming the first one whose text is not kept."""
    out = []
    for inst in target["instances"]:
        kept = state_dir / layout.KEPT_UNITS / f"{inst['sha']}.service"
        if not kept.exists():
            raise systemd_units.Failed(f"cannot restore {inst['unit']}: {kept} is missing")
        out.append({**inst, "text": kept.read_text()})
    return out
