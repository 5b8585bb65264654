"""The router in front of a host's instances, and its rotation. Runs ON THE HOST, as root, with
the system python3 (stdlib only), next to ``instances.py`` and ``health.py``.

The router's unit is brought to its text and restarted through its gate (a chat through it);
its rotation is read and changed through vllm-router's worker API (``/workers``, ``POST
/add_worker?url=``, ``POST /remove_worker?url=``), with the routers' admin key where the router
is another host's (its proxy passes the worker API only with it). No router wanted: its unit
and its proxy's are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import health  # noqa: E402  (next to this file on the host)
import layout  # noqa: E402
import systemd_units  # noqa: E402

ROUTER = layout.ROUTER_UNIT
PROXY = layout.PROXY_UNIT
ROUTER_ADMIN_KEY = Path(layout.ROUTER_ADMIN_KEY)


def admin_headers() -> dict[str, str]:
    """The routers' admin key, for another host's router (its proxy passes the worker API only
    with it; ``serve_router = "fleet"``); none where this host has none."""
    try:
        key = ROUTER_ADMIN_KEY.read_text().strip()
    except OSError:
        return {}
    return {"Authorization": f"Bearer {key}"} if key else {}


def router_call(admin: str, verb: str, worker: str) -> None:
    """Ask the router at ``admin`` (its worker API) to ``add`` or ``remove`` a worker. Best
    effort: a router that is not running routes to nothing (its start lists every worker), and
    one that does not answer still health-checks its workers and retries elsewhere."""
    url = f"{admin}/{verb}_worker?url={urllib.parse.quote(worker, safe='')}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=b"", method="POST", headers=admin_headers())
    try:
        with opener.open(request, timeout=10) as r:
            r.read(1 << 16)
        systemd_units.log(f"router {admin}: {'took' if verb == 'remove' else 'put'} {worker} "
                          f"{'out of' if verb == 'remove' else 'back in'} rotation")  # fmt: skip
    except (OSError, ValueError) as e:
        systemd_units.log(
            f"router {admin}: {verb}_worker {worker} failed ({e}); its health checks decide"
        )


def router_workers(router: dict[str, Any]) -> dict[str, bool] | None:
    """The workers the running router lists now, each with whether its own health checks find
    it healthy (its ``/workers``); None when it does not answer with such a list."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(router["admin"] + "/workers", timeout=10) as r:
            listed = json.loads(r.read(1 << 20))["workers"]
        return {str(w["url"]): w.get("is_healthy") is True for w in listed}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def bring_router(state: dict[str, Any]) -> None:
    """The router as ``state`` says: its unit written, restarted through its gate (a chat
    through it) when it runs another text, and its rotation holding exactly the instances
    (a run that died with one taken out puts it back); no router wanted: its unit removed."""
    router, path = state.get("router"), systemd_units.UNIT_DIR / ROUTER
    if router is None:
        for unit in (PROXY, ROUTER):  # the proxy first: clients get no answer, not a 502
            if (systemd_units.UNIT_DIR / unit).exists():
                systemd_units.systemctl("disable", "--now", "--quiet", unit, check=False)
                (systemd_units.UNIT_DIR / unit).unlink()
                systemd_units.systemctl("daemon-reload")
                systemd_units.log(f"{unit}: removed (serve_router is none)")
        for leftover in (layout.PROXY_CONF, layout.ROUTER_ADMIN_MAP):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        return
    if systemd_units.unit_sha(router["text"]) != router["sha"]:
        raise systemd_units.Failed(f"{ROUTER}: its text does not carry sha {router['sha']}")
    if not path.exists() or path.read_text() != router["text"]:
        systemd_units.write_atomic(path, router["text"])
        systemd_units.log(f"{ROUTER}: written (sha {router['sha']})")
    systemd_units.daemon_reload_if_needed([ROUTER])
    pid = int(systemd_units.show([ROUTER], "MainPID")[0].get("MainPID") or 0)
    active = systemd_units.show([ROUTER], "ActiveState")[0].get("ActiveState") == "active"
    if not (
        active
        and pid
        and systemd_units.process_env(pid).get(systemd_units.SHA_VAR) == router["sha"]
    ):
        systemd_units.systemctl("enable", "--quiet", ROUTER)
        systemd_units.systemctl("restart", ROUTER)
        systemd_units.log(f"{ROUTER}: restarted (gate {state['health_timeout']}s)")
        first = state["instances"][0]["unit"] if state["instances"] else None
        why = health.check(ROUTER, router["port"], state["model"], state["health_timeout"],
                           state.get("host") or "127.0.0.1", key_unit=first,
                           path=health.ROUTER_READY,
                           keyless=bool(state.get("keyless")))  # fmt: skip
        if why is not None:
            raise systemd_units.Failed(f"health gate: {ROUTER}: {why}", health.journal_tail(ROUTER))
        systemd_units.log(f"{ROUTER}: healthy on port {router['port']}")
    if not router.get("pd"):  # P/D pools are its argv's: its worker API cannot add them back
        listed = list(router_workers(router) or {})
        for worker in router["workers"]:
            if worker not in listed:
                router_call(router["admin"], "add", worker)
        for worker in listed:
            if worker not in router["workers"]:
                router_call(router["admin"], "remove", worker)
    wait_routed(router, state["health_timeout"])


def wait_routed(router: dict[str, Any], timeout: float) -> None:
    """Until the router's own health checks find every instance healthy (a restarted one is
    routed to only then), at most ``timeout`` s; an instance it still finds unhealthy fails."""
    deadline = time.monotonic() + timeout
    while True:
        seen = router_workers(router) or {}
        down = [w for w in router["workers"] if not seen.get(w)]
        if not down:
            return
        if time.monotonic() > deadline:
            raise systemd_units.Failed(
                f"{ROUTER}: it finds {', '.join(down)} unhealthy after {timeout:g}s"
            )
        time.sleep(0.5)
