#!/usr/bin/env python3
"""servefleet instances: converge, restore and roll back a host's servers. Runs ON THE HOST,
as root, with the system python3 (stdlib only), next to ``health.py``.

usage: instances.py converge STATE.json   # desired state: restart what differs, through the gate
       instances.py restore STATE_DIR     # bring back the last good state (after a driver change)
       instances.py rollback STATE_DIR    # by hand: back to the good state before the last one
       instances.py current ROOT RELEASE  # point ROOT/current at releases/RELEASE (by rename)
       instances.py router -              # a fleet router host: its router (state on stdin)
       instances.py peers STATE_DIR -     # re-check this host's decodes (state on stdin)

What runs is judged from the running processes, never from what a deploy wrote: each unit
carries ``Environment=SERVEFLEET_UNIT=<sha>`` (a hash of the rest of its text), so the main
process's environment tells which unit text it was started from. An instance is converged when
its unit is active and its main process runs the desired sha. Everything here can be
interrupted and re-run: the next run reads the processes again.

A state (the desired one, ``good.json``, ``previous.json``) is::

    {"root": "/opt/servefleet", "release": "<id>", "model": "org/name", "host": null,
     "cache_root": "...", "devices_env": "RBLN_VISIBLE_DEVICES",
     "health_timeout": 300, "prewarm_timeout": 14400,
     "instances": [{"unit": "servefleet-vllm-0.service", "sha": "...", "port": 8000,
                    "devices": "0", "fingerprint": "...", "text": "<the unit file>"}],
     "stale": []}

(kept states hold no texts: those are kept by sha in ``units/``.)

converge: unit files as the texts say, then for each instance in order, stop our other servers
holding its port or devices, then
restart it and pass the health gate (the first one with ``prewarm_timeout`` while its compile
fingerprint is cold). When every instance is healthy the state becomes ``good.json`` (the one
before it ``previous.json``) and unit texts are kept by sha in ``units/`` for rollbacks. A gate
failure rolls the whole host back to ``good.json`` through the gate and exits 1 naming the
release it rolled back to.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import health  # noqa: E402  (next to this file on the host)
import layout  # noqa: E402
import trusted  # noqa: E402

UNIT_DIR = Path(layout.UNIT_DIR)
UNIT_GLOB = layout.UNIT_GLOB
ROUTER = layout.ROUTER_UNIT
PROXY = layout.PROXY_UNIT
ROUTER_ADMIN_KEY = Path(layout.ROUTER_ADMIN_KEY)
SHA_VAR = layout.UNIT_SHA_VAR


class Failed(Exception):
    """A gate failed; the message is the one line to print (journal tail apart)."""

    def __init__(self, message: str, journal: str = "") -> None:
        super().__init__(message)
        self.journal = journal


def log(message: str) -> None:
    print(message, flush=True)


def systemctl(*args: str, check: bool = True) -> str:
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise Failed(f"systemctl {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def show(units: list[str], *props: str) -> list[dict[str, str]]:
    """``systemctl show`` of several units, one dict each (in order)."""
    if not units:
        return []
    args = [a for p in ("Id", *props) for a in ("-p", p)]
    out = systemctl("show", *args, *units, check=False)
    blocks = [b for b in out.split("\n\n") if b.strip()]
    by_id = {}
    for block in blocks:
        props_ = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        by_id[props_.get("Id", "")] = props_
    return [by_id.get(u, {}) for u in units]


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def process_port(pid: int) -> int | None:
    """The port the process serves on: its last ``--port`` (argparse's rule: a recipe's own
    ``--port`` comes before the one the deploy adds), or None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    port = None
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--port" and i + 1 < len(argv) else None
        if arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        if value and value.isdigit():
            port = int(value)
    return port


def live(devices_env: str) -> dict[str, dict[str, Any]]:
    """Every unit of ours on this host: what its main process runs, now."""
    units = sorted(p.name for p in UNIT_DIR.glob(UNIT_GLOB))
    out = {}
    for unit, props in zip(units, show(units, "ActiveState", "SubState", "MainPID"), strict=True):
        pid = int(props.get("MainPID") or 0)
        env = process_env(pid) if pid else {}
        out[unit] = {
            "active": props.get("ActiveState", "unknown"),
            "pid": pid,
            "sha": env.get(SHA_VAR),
            "key": env.get(layout.API_KEY_VAR),
            "port": process_port(pid) if pid else None,
            "devices": set(filter(None, env.get(devices_env, "").split(","))),
        }
    return out


def file_key() -> str | None:
    """The servers' API key as their EnvironmentFile holds it now (None: no key)."""
    try:
        text = Path(layout.API_KEY_FILE).read_text()
    except OSError:
        return None
    prefix = f"{layout.API_KEY_VAR}="
    return next((x[len(prefix) :] for x in text.splitlines() if x.startswith(prefix)), None)


def running_desired(now: dict[str, Any] | None, sha: str, key: str | None = None) -> bool:
    """Its main process runs ``sha`` with the key file's ``key`` (the unit's hash carries no
    digest of the key: a new key is seen here)."""
    return (
        now is not None and now["active"] == "active" and now["sha"] == sha
        and now.get("key") == key
    )  # fmt: skip


def warm_dir(state: dict[str, Any], create: bool = False) -> int | None:
    """A descriptor of root's own warm-marker directory in the serve user's cache root (see
    ``trusted``: what a serving process put there instead never counts); None: there is none."""
    if not create:
        return trusted.root_dir_in(state["cache_root"], layout.WARM_DIR)
    os.makedirs(state["cache_root"], exist_ok=True)
    parent = trusted.open_dir(state["cache_root"])
    if parent is None:
        raise Failed(f"{state['cache_root']} is not a directory")
    try:
        return trusted.root_dir(parent, layout.WARM_DIR, create=create)
    finally:
        os.close(parent)


def warm_record(state: dict[str, Any], fingerprint: str) -> dict[str, Any] | None:
    """The warm marker of ``fingerprint`` (None: not warm here)."""
    fd = warm_dir(state)
    if fd is None:
        return None
    try:
        record = json.loads(trusted.read(fd, fingerprint))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


def daemon_reload_if_needed(units: list[str]) -> None:
    props = show(units, "NeedDaemonReload")
    if any(p.get("NeedDaemonReload") == "yes" for p in props):
        systemctl("daemon-reload")


def make_room(state: dict[str, Any], inst: dict[str, Any]) -> None:
    """Stop our other servers that hold this instance's port or any of its devices."""
    wanted = set(filter(None, str(inst["devices"]).split(",")))
    for unit, now in live(state["devices_env"]).items():
        if unit == inst["unit"] or now["active"] not in ("active", "activating", "reloading"):
            continue
        if now["port"] == inst["port"] or now["devices"] & wanted:
            log(
                f"stopping {unit}: it holds port {now['port']} / devices "
                f"{','.join(sorted(now['devices'])) or '-'} that {inst['unit']} needs"
            )
            systemctl("stop", unit)


def is_cold(state: dict[str, Any], inst: dict[str, Any]) -> bool:
    """Its compile fingerprint is not warm here (``-``: nothing compiles, never cold)."""
    if inst["fingerprint"] == "-":
        return False
    fd = warm_dir(state)
    if fd is None:
        return True
    try:
        return not trusted.is_file(fd, inst["fingerprint"])
    finally:
        os.close(fd)


def start_through_gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
    cold = is_cold(state, inst)
    # a server that compiles nothing (GPU) loads from scratch at every start
    slow = cold or inst["fingerprint"] == "-"
    timeout = state["prewarm_timeout"] if slow else state["health_timeout"]
    started = time.time() - 1
    if restart:
        make_room(state, inst)
        # --no-reload: the restart reads the unit (bring_to reloaded a changed file) and boot reads
        # the link; a reload here, at every restart, cost each instance of a rollout 0.15-0.3 s
        # (bring_to reloads once at its end where systemd then asks for one)
        systemctl("enable", "--quiet", "--no-reload", inst["unit"])
        systemctl("restart", inst["unit"])
        log(f"{inst['unit']}: restarted ({'cold: compiling, ' if cold else ''}gate {timeout}s)")
        health.barrier(f"restarted-{inst['unit']}-{inst['fingerprint']}")  # tests' fault point
    else:
        log(f"{inst['unit']}: runs its unit; resuming the pre-warm (gate {timeout}s)")
    why = health.check(
        inst["unit"],
        inst["port"],
        state["model"],
        timeout,
        state.get("host") or "127.0.0.1",
        answered_timeout=state["health_timeout"],
    )
    if why is not None:
        raise Failed(f"health gate: {inst['unit']}: {why}", health.journal_tail(inst["unit"]))
    if cold:
        mark_warm(state, inst["fingerprint"], bundle_dirs(state, inst["unit"], started))
    log(f"{inst['unit']}: healthy on port {inst['port']}")


BUNDLE_LINE = re.compile(r"rbln mega-cache bundle (?:to|from) (/\S+/mega_cache\.bin)")


def bundle_dirs(state: dict[str, Any], unit: str, since: float) -> list[str]:
    """The compile-cache directories this start saved or loaded, relative to the cache root:
    ``rbln/<model>/<sig>`` from vllm-rbln's "Saved/Loaded rbln mega-cache bundle" lines in this
    invocation's journal, else the bundles written since ``since``. They are what a fleet
    pre-warm copies to the other hosts."""
    root = Path(state["cache_root"])
    invocation = show([unit], "InvocationID")[0].get("InvocationID", "")
    found: set[Path] = set()
    for _ in range(10):  # journald may lag the server's first answer a little
        if invocation:
            out = subprocess.run(
                ["journalctl", "-o", "cat", "--no-pager", f"_SYSTEMD_INVOCATION_ID={invocation}"],
                capture_output=True, text=True,
            ).stdout  # fmt: skip
            found = {Path(m) for m in BUNDLE_LINE.findall(out)}
        if found:
            break
        time.sleep(0.5)
    if not found:
        found = {
            p for p in root.glob("rbln/*/*/rank*/mega_cache.bin") if p.stat().st_mtime >= since
        }
    dirs = set()
    for bundle in found:
        with contextlib.suppress(ValueError):
            rel = bundle.parent.parent.relative_to(root)
            if len(rel.parts) == 3 and ".." not in rel.parts and bundle.is_file():
                dirs.add(str(rel))  # only a cache that is on disk now can be copied
    return sorted(dirs)


def mark_warm(
    state: dict[str, Any],
    fingerprint: str,
    dirs: list[str],
    source: str = "",
    seal: dict[str, list[Any]] | None = None,
) -> None:
    """The fingerprint is warm here; ``dirs`` hold its cache (a fleet pre-warm copies them).

    The record carries the cache's seal: each file's size and sha256 as root found them when
    the compile ended (``seal``: a checked copy's manifest). A fleet copy is packed only from a
    cache that still matches it, so what a serving process wrote since never leaves the host.
    """
    if seal is None:
        seal = cache_seal(state["cache_root"], dirs)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "dirs": dirs,
        "source": source or "compiled",
        "seal": seal,
    }
    fd = warm_dir(state, create=True)
    assert fd is not None
    try:
        trusted.write(fd, fingerprint, json.dumps(record, sort_keys=True) + "\n")
    finally:
        os.close(fd)


def cache_seal(cache_root: str, dirs: list[str]) -> dict[str, list[Any]] | None:
    """The files of ``dirs`` under the serve user's cache root, read through descriptors with no
    link followed (None when one is not a plain tree: that cache is never copied)."""
    cache = trusted.open_dir(cache_root)
    if cache is None:
        return None
    try:
        seal: dict[str, list[Any]] = {}
        for d in dirs:
            fd = trusted.open_below(cache, d)
            try:
                seal.update(trusted.digests(fd, d))
            finally:
                os.close(fd)
        return seal
    except OSError:
        return None
    finally:
        os.close(cache)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_units(state: dict[str, Any]) -> None:
    """Each instance's unit file as its text says (atomically, only where it differs)."""
    for inst in state["instances"]:
        path = UNIT_DIR / inst["unit"]
        if unit_sha(inst["text"]) != inst["sha"]:
            raise Failed(f"{inst['unit']}: its text does not carry sha {inst['sha']}")
        if not path.exists() or path.read_text() != inst["text"]:
            write_atomic(path, inst["text"])
            log(f"{inst['unit']}: written (sha {inst['sha']})")


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
        log(f"router {admin}: {'took' if verb == 'remove' else 'put'} {worker} "
            f"{'out of' if verb == 'remove' else 'back in'} rotation")  # fmt: skip
    except (OSError, ValueError) as e:
        log(f"router {admin}: {verb}_worker {worker} failed ({e}); its health checks decide")


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
    router, path = state.get("router"), UNIT_DIR / ROUTER
    if router is None:
        for unit in (PROXY, ROUTER):  # the proxy first: clients get no answer, not a 502
            if (UNIT_DIR / unit).exists():
                systemctl("disable", "--now", "--quiet", unit, check=False)
                (UNIT_DIR / unit).unlink()
                systemctl("daemon-reload")
                log(f"{unit}: removed (serve_router is none)")
        for leftover in (layout.PROXY_CONF, layout.ROUTER_ADMIN_MAP):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        return
    if unit_sha(router["text"]) != router["sha"]:
        raise Failed(f"{ROUTER}: its text does not carry sha {router['sha']}")
    if not path.exists() or path.read_text() != router["text"]:
        write_atomic(path, router["text"])
        log(f"{ROUTER}: written (sha {router['sha']})")
    daemon_reload_if_needed([ROUTER])
    pid = int(show([ROUTER], "MainPID")[0].get("MainPID") or 0)
    active = show([ROUTER], "ActiveState")[0].get("ActiveState") == "active"
    if not (active and pid and process_env(pid).get(SHA_VAR) == router["sha"]):
        systemctl("enable", "--quiet", ROUTER)
        systemctl("restart", ROUTER)
        log(f"{ROUTER}: restarted (gate {state['health_timeout']}s)")
        first = state["instances"][0]["unit"] if state["instances"] else None
        why = health.check(ROUTER, router["port"], state["model"], state["health_timeout"],
                           state.get("host") or "127.0.0.1", key_unit=first,
                           path=health.ROUTER_READY,
                           keyless=bool(state.get("keyless")))  # fmt: skip
        if why is not None:
            raise Failed(f"health gate: {ROUTER}: {why}", health.journal_tail(ROUTER))
        log(f"{ROUTER}: healthy on port {router['port']}")
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
            raise Failed(f"{ROUTER}: it finds {', '.join(down)} unhealthy after {timeout:g}s")
        time.sleep(0.5)


def bring_to(state: dict[str, Any]) -> None:
    """Make the running instances those of ``state``: each through the gate, in order (taken
    out of the router's rotation while it restarts), then the router."""
    units = [i["unit"] for i in state["instances"]]
    write_units(state)
    daemon_reload_if_needed(units)
    now = live(state["devices_env"])
    routers = state.get("routers") or []
    restarted = set()
    key = file_key()
    for inst in state["instances"]:
        current = now.get(inst["unit"])
        keyed = f"EnvironmentFile={layout.API_KEY_FILE}" in inst.get("text", "")
        restart = not running_desired(current, inst["sha"], key if keyed else None)
        if restart or is_cold(state, inst):
            worker = str(inst.get("worker") or "") if restart else ""
            for admin in routers if worker else ():
                router_call(admin, "remove", worker)
            start_through_gate(state, inst, restart)
            if restart:
                restarted.add(inst.get("role"))
            for admin in routers if worker else ():
                router_call(admin, "add", worker)
            now = live(state["devices_env"])
    for unit in state.get("stale", []):
        if (UNIT_DIR / unit).exists():
            systemctl("disable", "--now", "--quiet", unit, check=False)
            (UNIT_DIR / unit).unlink()
            log(f"{unit}: removed (no device group for it now)")
    if state.get("stale"):
        systemctl("daemon-reload")
    else:  # systemd 257 marks a unit enabled with --no-reload as changed on disk (252 does not)
        daemon_reload_if_needed(units)
    bring_router(state)
    if state.get("pd") and state.get("router") and restarted & {"prefill", "decode"}:
        own = [str(i["worker"]) for i in state["instances"] if i.get("role") == "prefill"]
        recheck_peers(state, own)  # the host's own pools (behind fleet routers: peers())


def recheck_peers(state: dict[str, Any], prefills: list[str]) -> None:
    """After a prefill or a decode restarted: each decode of this host takes one request from
    each prefill in ``prefills`` (their base URLs), as the router sends it
    (:func:`health.pd_probe`). A decode that cannot read from one (NIXL can keep a restarted
    peer's old state) restarts through its gate, and must then pass."""
    first = state["instances"][0]["unit"] if state["instances"] else None
    key = health.api_key(health.unit_state(first)) if first else None

    def failing(decode: dict[str, Any]) -> str | None:
        for prefill in prefills:
            why = health.pd_probe(prefill, str(decode["worker"]), state["model"],
                                  state["health_timeout"], key)  # fmt: skip
            if why is not None:
                return why
        return None

    for inst in state["instances"]:
        if inst.get("role") != "decode" or not inst.get("worker") or not prefills:
            continue
        why = failing(inst)
        if why is not None:
            log(f"{inst['unit']}: a request through prefill and decode failed ({why}): "
                "restarting it")  # fmt: skip
            start_through_gate(state, inst, True)
            why = failing(inst)
            if why is not None:
                raise Failed(f"{inst['unit']}: prefill/decode re-check: {why}")
        log(f"{inst['unit']}: a request from each of {len(prefills)} prefill(s) passed")


def peers(state_dir: Path, doc: dict[str, Any]) -> int:
    """A decode host behind fleet routers, after a host of its run restarted servers: its
    decodes re-checked against the run's prefills (``doc``: the host's desired state and
    ``prefills``, their base URLs; from stdin)."""
    with state_lock(state_dir):
        try:
            recheck_peers(doc, [str(p) for p in doc.get("prefills") or []])
        except Failed as failure:
            report(failure)
            return 1
    return 0


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """One converge, restore, rollback or re-check at a time: a run whose controller died may
    still be at work here."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / layout.STATE_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def unit_sha(text: str) -> str | None:
    m = re.search(rf'^Environment="{SHA_VAR}=([0-9a-f]+)"$', text, re.M)
    return m.group(1) if m else None


def keep_units(state_dir: Path, state: dict[str, Any]) -> None:
    """Keep the unit texts of a good state by sha, for rollbacks."""
    store = state_dir / layout.KEPT_UNITS
    store.mkdir(parents=True, exist_ok=True)
    for inst in state["instances"]:
        target = store / f"{inst['sha']}.service"
        if not target.exists():
            write_atomic(target, inst["text"])


def load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
    ids = set()
    for path in [*glob.glob(str(UNIT_DIR / UNIT_GLOB)), str(UNIT_DIR / ROUTER)]:
        with contextlib.suppress(OSError):
            ids.update(re.findall(rf"/{layout.RELEASES}/([0-9a-f]+)/", Path(path).read_text()))
    return ids


def clean_up(state_dir: Path) -> None:
    """Remove releases and kept units nothing can need: keep ``current``, every release a unit
    on disk names, and those of the good and previous states."""
    root = state_dir.parent
    states = [s for s in (load(state_dir / layout.GOOD), load(state_dir / layout.PREVIOUS)) if s]
    keep = released_in_units() | {s["release"] for s in states}
    keep |= {s["router"]["release"] for s in states if s.get("router")}
    cur = root / layout.CURRENT
    if os.path.islink(cur):
        keep.add(os.path.basename(os.readlink(cur)))
    releases = root / layout.RELEASES
    for rel in sorted(releases.iterdir()) if releases.is_dir() else []:
        if rel.name not in keep:
            shutil.rmtree(rel, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (root / layout.PLANS / f"{rel.name}.json").unlink()
            log(f"release {rel.name}: removed (no unit or state names it)")
    shas = {i["sha"] for s in states for i in s["instances"]}
    for kept in (state_dir / layout.KEPT_UNITS).glob("*.service"):
        if kept.stem not in shas:
            kept.unlink()


def record_good(state_dir: Path, state: dict[str, Any]) -> None:
    good = {k: v for k, v in state.items() if k != "stale"}
    good["instances"] = [{k: v for k, v in i.items() if k != "text"} for i in state["instances"]]
    old = load(state_dir / layout.GOOD)
    if old and [i["sha"] for i in old["instances"]] != [i["sha"] for i in good["instances"]]:
        write_atomic(state_dir / layout.PREVIOUS, json.dumps(old, indent=1, sort_keys=True) + "\n")
    write_atomic(state_dir / layout.GOOD, json.dumps(good, indent=1, sort_keys=True) + "\n")


def restore(state_dir: Path, target: dict[str, Any]) -> None:
    """Unit files, ``current`` and running instances back to ``target``, through the gate."""
    instances = []
    for inst in target["instances"]:
        kept = state_dir / layout.KEPT_UNITS / f"{inst['sha']}.service"
        if not kept.exists():
            raise Failed(f"cannot restore {inst['unit']}: {kept} is missing")
        instances.append({**inst, "text": kept.read_text()})
    wanted = {i["unit"] for i in instances}
    extra = [p.name for p in UNIT_DIR.glob(UNIT_GLOB) if p.name not in wanted]
    bring_to({**target, "instances": instances, "stale": extra})
    point_current(state_dir.parent, target["release"])


def converge(desired_file: Path) -> int:
    desired = json.loads(desired_file.read_text())
    state_dir = desired_file.parent
    try:
        bring_to(desired)
        keep_units(state_dir, desired)
        record_good(state_dir, desired)
        clean_up(state_dir)
        return 0
    except Failed as failure:
        report(failure)
    good = load(state_dir / layout.GOOD)
    if good is None:
        print("servefleet: no earlier good state on this host to roll back to", file=sys.stderr)
        return 1
    try:
        restore(state_dir, good)
    except Failed as again:
        report(again)
        print(f"servefleet: rolling back to {good['release']} failed too", file=sys.stderr)
        return 1
    print(f"servefleet: rolled back to {good['release']}", file=sys.stderr)
    return 1


def report(failure: Failed) -> None:
    unit = str(failure).split(": ")[1] if str(failure).startswith("health gate: ") else ""
    sys.stderr.write(f"servefleet: {failure}\n")
    if failure.journal:
        sys.stderr.write(f"--- journal tail of {unit} ---\n{failure.journal}")
    sys.stderr.flush()


def router_only(state: dict[str, Any]) -> int:
    """A fleet router host (it serves nothing): its router as ``state`` says, through its gate
    (``state``: ``router``, ``model``, ``host``, ``health_timeout``, ``keyless``; from stdin)."""
    try:
        bring_router({**state, "instances": []})
    except Failed as failure:
        report(failure)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "current":
        point_current(Path(argv[1]), argv[2])
        return 0
    if argv == ["router", "-"]:
        return router_only(json.load(sys.stdin))
    if len(argv) == 3 and argv[0] == "peers" and argv[2] == "-":
        return peers(Path(argv[1]), json.load(sys.stdin))
    if len(argv) != 2 or argv[0] not in ("converge", "restore", "rollback"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    command, arg = argv
    with state_lock(Path(arg).parent if command == "converge" else Path(arg)):
        return locked(command, arg)


def locked(command: str, arg: str) -> int:
    if command == "converge":
        return converge(Path(arg))
    state_dir = Path(arg)
    good, previous = load(state_dir / layout.GOOD), load(state_dir / layout.PREVIOUS)
    target = good if command == "restore" else previous
    if target is None:
        which = "good" if command == "restore" else "previous"
        print(f"servefleet: no {which} state on this host; nothing to {command}", file=sys.stderr)
        return 0 if command == "restore" else 1
    try:
        restore(state_dir, target)
    except Failed as failure:
        report(failure)
        return 1
    if command == "rollback":
        assert good is not None
        write_atomic(state_dir / layout.PREVIOUS, json.dumps(good, indent=1, sort_keys=True) + "\n")
        write_atomic(state_dir / layout.GOOD, json.dumps(target, indent=1, sort_keys=True) + "\n")
        clean_up(state_dir)
        print(f"servefleet: rolled back to {target['release']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
