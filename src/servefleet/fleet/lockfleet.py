"""``servefleet lock``: the stacks, driver and models an inventory's data asks for, locked.

Reads the inventory and its group data with pyinfra's loader (no host is contacted), validates each
host's data, resolves its selection, and gathers what the lock covers: every distinct stack,
the driver runfile of each driver version, each model's revision and archive sha256, and each
file ``serve_files`` ships.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.base.download import opener, unreachable
from servefleet.base.errors import DataError, RecipeError
from servefleet.base.remote import retry
from servefleet.fleet.inventory import read_inventory
from servefleet.release.lock import Lock, differences, load_lock, write_lock
from servefleet.release.owners import check_owners
from servefleet.release.pylock import packages, release_id
from servefleet.release.resolve import resolve
from servefleet.release.stack import LockError, Stack
from servefleet.release.uvbin import uv_version, uv_wheel
from servefleet.settings.table import Settings
from servefleet.spec import ServeSpec


@dataclass
class FleetLock:
    """What an inventory's data asks a lock to hold."""

    lock_dir: Path
    stacks: dict[Stack, Settings]  # each stack with the settings of a host that uses it
    driver: dict[str, dict[str, str]]
    models: dict[str, dict[str, Any]]  # model id -> what the data pins (revision, sha256)
    model_sources: dict[str, Settings]  # model id -> settings of a host that fetches it
    files: dict[str, dict[str, str]] = field(default_factory=dict)  # serve_files: argv -> entry


def _hosts(
    inventory: str,
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    limit: Sequence[str] = (),
) -> list[tuple[str, Settings]]:
    fleet = read_inventory(inventory, overrides)
    names = fleet.select(limit) if limit else None
    return list(fleet.settings(names, environ=environ).items())


def alternatives(settings: Settings, spec: ServeSpec) -> list[Stack]:
    """Every stack a host of this data can get: one for each choice of sources its glibc can
    make (servefleet.release.glibc), the ones no host can install left out. No host is contacted, so
    all of them are locked.

    + settings: a host's validated data (unlocked)
    + spec: its resolved selection
    """
    from servefleet.release.glibc import glibc_refusal, levels
    from servefleet.release.plan import plan_release

    out: list[Stack] = []
    for glibc in levels(settings.pip_indexes):
        rel = plan_release(settings, spec, None, glibc)
        owned = {d.name: d.version for d in rel.downloads}
        if rel.stack is not None and rel.stack not in out:
            if glibc_refusal(settings.pip_indexes, owned, glibc) is None:
                out.append(rel.stack)
    return out


def fleet_lock(
    inventory: str,
    overrides: Mapping[str, Any],
    lock_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
    limit: Sequence[str] = (),
) -> FleetLock:
    """Gather what the inventory's hosts need locked.

    + inventory: a pyinfra inventory file
    + overrides: data over everything (as ``pyinfra --data``)
    + lock_dir: where the lock lives (default: the hosts' ``sdk_lock``)
    + environ: where credentials are read from (default: this process's environment)
    + limit: only these hosts (``--limit`` patterns; none: every host)
    """
    from servefleet.hostplan.extras import resolve_for
    from servefleet.kinds import kind_named
    from servefleet.release.plan import plan_router_release, shipped_files, unlocked as without_lock

    stacks: dict[Stack, Settings] = {}
    driver: dict[str, dict[str, str]] = {}
    models: dict[str, dict[str, Any]] = {}
    sources: dict[str, Settings] = {}
    files: dict[str, tuple[str, dict[str, str]]] = {}  # argv -> (a host shipping it, its entry)
    dirs = set()
    for name, settings in _hosts(inventory, overrides, environ, limit):
        dirs.add(settings.sdk_lock)
        unlocked = without_lock(settings)
        try:
            spec = resolve_for(unlocked)
        except RecipeError as e:
            raise DataError(f"{name}: serve_recipe/serve_selection: {e}") from None
        for st in alternatives(unlocked, spec):
            stacks.setdefault(st, unlocked)
        if not settings.router_off:  # the router's own release
            router = plan_router_release(unlocked).stack
            assert router is not None
            stacks.setdefault(router, unlocked)
        if kind_named(spec.kind).driver_step == "runfile" and settings.driver_runfile_url:
            version = settings.driver_version
            driver[version] = {
                "url": settings.driver_runfile_url.replace("{version}", version),
                "sha256": settings.driver_sha256.get(version, ""),
            }
        for model in spec.requirements.models:
            models[model] = {
                "revision": settings.models_revisions.get(model),
                "sha256": settings.models_sha256.get(model),
            }
            sources.setdefault(model, unlocked)
        for f in shipped_files(settings):
            first, entry = files.setdefault(f.argv, (name, f.lock_entry()))
            if entry["sha256"] != f.sha256:
                raise DataError(
                    f"serve_files: {first} and {name} ship different files as {f.argv!r}; "
                    "allowed: one file for each path on every host of a lock"
                )
    shipped = {argv: entry for argv, (_, entry) in files.items()}
    return FleetLock(_lock_dir(dirs, lock_dir), stacks, driver, models, sources, shipped)


def _lock_dir(dirs: set[str | None], lock_dir: str | None) -> Path:
    chosen = (lock_dir or next(iter(dirs))) if len(dirs) == 1 else lock_dir
    if not chosen:
        raise DataError(
            "sdk_lock: not set (or not the same on every host); set it in group_data "
            "(e.g. locks/prod) or pass --lock-dir"
        )
    return Path(chosen)


def lock_settings(
    inventory: str,
    overrides: Mapping[str, Any],
    lock_dir: str | None = None,
    limit: Sequence[str] = (),
) -> tuple[Path, Settings]:
    """The lock directory the inventory's data names (as ``servefleet lock`` finds it), and the
    settings of its first host (the controller's credentials, read from the variables its data
    names).

    + inventory: a pyinfra inventory file
    + overrides: data over everything (as ``pyinfra --data``)
    + lock_dir: the lock directory, over the data's ``sdk_lock``
    + limit: only these hosts (``--limit`` patterns; none: every host)
    """
    hosts = _hosts(inventory, overrides, limit=limit)
    return _lock_dir({s.sdk_lock for _, s in hosts}, lock_dir), hosts[0][1]


Fetch = Callable[[str, Mapping[str, str]], bytes]


MAX_MANIFEST = 16 * 1024 * 1024  # bytes of a store's manifest.json the lock reads


def _fetch(url: str, headers: Mapping[str, str]) -> bytes:
    request = urllib.request.Request(url, headers=dict(headers))

    def once() -> bytes:
        with opener().open(request, timeout=30) as response:
            data = bytes(response.read(MAX_MANIFEST + 1))[: MAX_MANIFEST + 1]
            if len(data) <= MAX_MANIFEST:
                retry.check_whole(response)
            return data

    try:
        return retry.attempts(once)
    except retry.GaveUp as e:
        raise unreachable(url, e.last) from None
    except (urllib.error.URLError, OSError) as e:
        raise LockError(f"{url}: not readable ({e})") from None


def locked_models(fl: FleetLock, fetch: Fetch = _fetch) -> dict[str, dict[str, Any]]:
    """Each model's revision and, from a store, its archive's URL and sha256 (from the store's
    manifest.json); from the hub, the revision the data pins (None: not pinned).

    + fl: what the inventory needs
    + fetch: reads a URL (tests pass their own)
    """
    out: dict[str, dict[str, Any]] = {}
    manifests: dict[str, dict[str, Any]] = {}
    for model, pinned in sorted(fl.models.items()):
        s = fl.model_sources[model]
        if not s.models_store_url:
            out[model] = {"revision": pinned["revision"], "url": None, "sha256": None}
            continue
        store = s.models_store_url.rstrip("/")
        if store not in manifests:
            headers = {"Authorization": f"Bearer {s.hf_token}"} if s.hf_token else {}
            try:
                manifests[store] = json.loads(fetch(f"{store}/manifest.json", headers))["models"]
            except (ValueError, KeyError, TypeError):
                raise LockError(f"{store}/manifest.json: not a model store manifest") from None
        entry = manifests[store].get(model)
        if not isinstance(entry, dict):
            raise LockError(f"{store}: has no {model}")
        out[model] = {
            "revision": entry.get("revision"),
            "url": f"{store}/{entry.get('path', model + '.tar.gz')}",
            "sha256": entry.get("sha256"),
        }
    return out


def _previous(lock_dir: Path) -> Lock | None:
    """The lock already in lock_dir (None: there is none, or it cannot be read)."""
    try:
        return load_lock(lock_dir)
    except LockError:
        return None


def _versions(text: str) -> set[str]:
    return {f"{p['name']}=={p['version']}" for p in packages(text)}


def uv_moved(pinned: str, previous: Lock, st: Stack, text: str) -> str | None:
    """Why the controller's uv cannot re-lock a stack under the uv the lock pins (None: it can):
    a stack whose inputs did not change must resolve to the same versions, or the controller's
    uv is not one that gives the same resolution (#53). Files and hashes are the index's: a file
    it serves with other bytes shows in the lock's diff, whichever uv resolved it.

    + pinned: the uv version the lock pins
    + previous: the lock on disk
    + st: the stack, as the data asks for it now
    + text: its lock text, as the controller's uv resolved it
    """
    old = previous.stacks.get(st.name)
    if old is None or old.input != st.digest:
        return None
    now, then = _versions(text), _versions(old.pylock)
    if now == then:
        return None
    moved = [*(f"-{v}" for v in sorted(then - now)), *(f"+{v}" for v in sorted(now - then))]
    return (
        f"stack {st.name}: uv {uv_version()} resolves its unchanged inputs to other versions "
        f"than uv {pinned} (the lock's) did ({', '.join(moved[:6])}); to move the lock to "
        f"uv {uv_version()}, run `servefleet lock INVENTORY --move-uv`"
    )


TICK = 15  # seconds between the progress lines of a step that lasts


@contextlib.contextmanager
def _telling(progress: Callable[[str], None] | None, what: str) -> Iterator[None]:
    """Say ``what`` starts, then every :data:`TICK` s how long it has taken, until it ends."""
    if progress is None:
        yield
        return
    progress(f"{what} ...")
    done, t0 = threading.Event(), time.monotonic()

    def tick() -> None:
        while not done.wait(TICK):
            progress(f"{what}: {time.monotonic() - t0:.0f} s")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def make_lock(
    fl: FleetLock,
    echo: Callable[[str], None] = print,
    move_uv: bool = False,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Resolve every stack, check its owners, and write the lock directory. The hosts' uv stays
    the one the lock pins (the controller's uv re-locks only when it resolves each unchanged
    stack the same); ``move_uv`` pins the controller's uv instead.

    + fl: what the inventory needs
    + echo: where progress lines go
    + move_uv: pin the controller's uv for the hosts (an explicit step)
    + progress: where a line goes before each long step (each stack's resolve, which waits on
      its indexes; the models' files), and every :data:`TICK` seconds while it lasts; None: none
    """
    previous = _previous(fl.lock_dir)
    pinned = previous.uv["version"] if previous and previous.uv and not move_uv else None
    locked = {}
    for st, s in sorted(fl.stacks.items(), key=lambda kv: kv[0].name):
        with _telling(progress, f"stack {st.name}: resolving with uv against its indexes"):
            text = resolve(st, s.index_user, s.index_password)
        check_owners(st, text, s.index_user, s.index_password)
        if previous is not None and pinned is not None and pinned != uv_version():
            why = uv_moved(pinned, previous, st, text)
            if why:
                raise LockError(why)
        locked[st] = text
        echo(f"stack {st.name}: {len(packages(text))} packages, release {release_id(text)}")
    with _telling(progress, "models: reading their files' sizes and hashes"):
        models = locked_models(fl)
    for model, entry in models.items():
        if not entry["revision"]:
            echo(f"model {model}: not pinned (set models_revisions, or use a model store)")
    for argv, entry in sorted(fl.files.items()):
        echo(f"file {argv}: sha256 {entry['sha256']}")
    publics = sorted({st.inputs["public_index"] for st in fl.stacks if st.inputs["public_index"]})
    uv = uv_wheel(publics[0], pinned) if publics else None
    echo(f"uv {uv['version']}: {uv['file']}" if uv else "uv: no public index, the deploy sends it")
    write_lock(fl.lock_dir, locked, fl.driver, models, fl.files, uv)
    echo(f"wrote {fl.lock_dir}: review its diff, commit it, then roll out")


def check_lock(fl: FleetLock) -> list[str]:
    """What differs between the lock on disk and the data (offline: no index is asked). The
    controller's uv is not compared: the hosts run the uv the lock pins, and install the locked
    files, whichever uv the controller has (#53).

    + fl: what the inventory needs
    """
    try:
        lock: Lock = load_lock(fl.lock_dir)
    except LockError as e:
        return [str(e)]
    stores = {model: s.models_store_url for model, s in fl.model_sources.items()}
    return differences(lock, fl.stacks, fl.driver, fl.models, fl.files, stores)
