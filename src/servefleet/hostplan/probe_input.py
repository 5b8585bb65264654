"""What the host probe (``remote/probe.py``) is asked: its one JSON argument, with every path a
deploy manages outside releases and units (the host programs of ``remote/`` among them, which
the deploy uploads), so a run that would change none of them adds no operation.

Pure (no pyinfra import).
"""

from __future__ import annotations

import contextlib
import json

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import (
    API_KEY_FILE,
    ASGI,
    HF_TOKEN_FILE,
    LIB,
    NETRC,
    PATH_GUARD_MODULE,
    PLANS,
    PROXY_CONF,
    PROXY_UNIT,
    RELEASE_FILES,
    RELEASES,
    ROUTER_ADMIN_KEY,
    ROUTER_ADMIN_MAP,
    ROUTER_UNIT,
    SECRETS_DIR,
    STATE,
    UNIT_DIR,
)
from servefleet.kinds import kind_of, platforms_of
from servefleet.platforms import probe_commands
from servefleet.release.glibc import levels
from servefleet.release.plan import (
    host_uv_path,
    plan_release,
    plan_router_release,
    shipped_files,
)
from servefleet.router.plan import admin_url
from servefleet.settings.table import Settings
from servefleet.spec import ServeSpec

REMOTE_SCRIPTS = (
    "layout.py", "trusted.py", "retry.py", "install_release.py", "fetch_model.py", "refusal.py",
    "http_client.py", "tar_safety.py", "snapshot_place.py", "store_source.py", "hub_source.py",
    "hub_client.py", "health.py", "instances.py", "prewarm.py", "driver.py", "preflight.py",
    "trees.py", "group.py", "systemd_units.py", "warm_state.py", "restart_gate.py",
    "rotation.py", "state_files.py", "release_check.py", "content_check.py", "fault_point.py",
    "unprivileged.py",
)  # fmt: skip


def watched_paths(settings: Settings, *release_ids: str) -> list[str]:
    """Every directory and file a deploy manages outside releases and units: the probe stats
    them (and hashes the files), so a run that would change none of them adds no operation.

    + release_ids: ids of the releases the host may get (by its glibc): their plan files
    """
    root = settings.serve_root
    lib = [f"{root}/{LIB}/{script}" for script in REMOTE_SCRIPTS]
    lib += [f"{root}/{LIB}/{ASGI}", f"{root}/{LIB}/{ASGI}/{PATH_GUARD_MODULE}.py"]
    dirs = [root, *(f"{root}/{d}" for d in (LIB, PLANS, RELEASES, STATE))]
    dirs += [SECRETS_DIR, settings.serve_cache_root, settings.models_hf_home]
    uv = [path] if (path := host_uv_path(settings)) else []
    plans = [f"{root}/{PLANS}/{i}.json" for i in dict.fromkeys(release_ids)]
    shipped = []  # serve_files: each release's files/ and what it holds
    for i in dict.fromkeys(release_ids) if settings.serve_files else ():
        top = f"{root}/{RELEASES}/{i}/{RELEASE_FILES}"
        shipped += [top, *(f"{top}/{f.name}" for f in shipped_files(settings))]
    if not settings.router_off:  # the router's release: its plan file
        with contextlib.suppress(DataError):  # not locked: plan_host says why
            plans.append(f"{root}/{PLANS}/{plan_router_release(settings).id}.json")
    proxy = [PROXY_CONF, f"{UNIT_DIR}/{PROXY_UNIT}", ROUTER_ADMIN_MAP, ROUTER_ADMIN_KEY]
    return [*dirs, *lib, *uv, *plans, *shipped, NETRC, HF_TOKEN_FILE, API_KEY_FILE, *proxy]


def _router_admin(settings: Settings) -> str | None:
    """Where the probe asks the host's router which workers it lists (None: no router)."""
    return None if settings.router_off else admin_url(settings)


def probe_args(
    settings: Settings, spec: ServeSpec, files: bool = False, keyed: bool = False
) -> str:
    """The probe's one argument (JSON, ``remote/probe.py``): paths, the serve user and the wanted models.

    + files: also read the file hashes the serving release was installed with (``plan``)
    + keyed: the probe reads a key on stdin and reports the secrets' digests as HMACs under it
      (without: no digest for them)
    """
    models = {m: settings.models_revisions.get(m) for m in spec.requirements.models}
    # the release depends on the host's glibc, which this probe reads: watch each one's plan
    ids = []
    for glibc in levels(settings.pip_indexes):
        try:
            ids.append(plan_release(settings, spec, NETRC, glibc).id)
        except DataError:  # not locked (no host can install it) or bad: plan_host says why
            continue
    return json.dumps(
        {
            "root": settings.serve_root,
            "hf_home": settings.models_hf_home,
            "cache_root": settings.serve_cache_root,
            "user": settings.serve_user,
            "accelerators": [
                list(c) for c in probe_commands(platforms_of(kind_of(settings.serve_recipe)))
            ],
            "models": models,
            "paths": watched_paths(settings, *ids),
            "releases": ids,  # checked against what their markers recorded (#36)
            "verify": settings.serve_verify,  # ... every file's sha256 too
            "fingerprint": spec.compile_fingerprint,  # the one warm cache it checks
            "files": files,
            "keyed": keyed,
            "python": settings.sdk_python,
            "router": {"unit": ROUTER_UNIT, "url": _router_admin(settings)},
        }
        # a rank of a serving group without serve_iface: the interfaces' addresses
        | ({"addresses": True} if settings.serve_group and not settings.serve_iface else {}),
        sort_keys=True,
    )
