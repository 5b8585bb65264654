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

Its parts are host modules beside it: ``systemd_units`` (systemctl, the unit files, what each
main process runs), ``restart_gate`` (a restart through the health gate, the prefill/decode
re-check), ``warm_state`` (the warm markers), ``rotation`` (the router and its worker API) and
``state_files`` (the kept states, ``current``, the lock, the clean-up).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402  (next to this file on the host)
import restart_gate  # noqa: E402
import rotation  # noqa: E402
import state_files  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402


def bring_to(state: dict[str, Any]) -> None:
    """Make the running instances those of ``state``: each through the gate, in order (taken
    out of the router's rotation while it restarts), then the router."""
    units = [i["unit"] for i in state["instances"]]
    systemd_units.write_units(state)
    systemd_units.daemon_reload_if_needed(units)
    now = systemd_units.live(state["devices_env"])
    routers = state.get("routers") or []
    restarted = set()
    key = systemd_units.file_key()
    for inst in state["instances"]:
        current = now.get(inst["unit"])
        keyed = f"EnvironmentFile={layout.API_KEY_FILE}" in inst.get("text", "")
        restart = not systemd_units.running_desired(current, inst["sha"], key if keyed else None)
        restart = restart or bool(current and current.get("older_than_release"))
        if restart or warm_state.is_cold(state, inst):
            worker = str(inst.get("worker") or "") if restart else ""
            for admin in routers if worker else ():
                rotation.router_call(admin, "remove", worker)
            restart_gate.start_through_gate(state, inst, restart)
            if restart:
                restarted.add(inst.get("role"))
            for admin in routers if worker else ():
                rotation.router_call(admin, "add", worker)
            now = systemd_units.live(state["devices_env"])
    for unit in state.get("stale", []):
        if (systemd_units.UNIT_DIR / unit).exists():
            systemd_units.systemctl("disable", "--now", "--quiet", unit, check=False)
            (systemd_units.UNIT_DIR / unit).unlink()
            systemd_units.log(f"{unit}: removed (no device group for it now)")
    if state.get("stale"):
        systemd_units.systemctl("daemon-reload")
    else:  # systemd 257 marks a unit enabled with --no-reload as changed on disk (252 does not)
        systemd_units.daemon_reload_if_needed(units)
    rotation.bring_router(state)
    if state.get("pd") and state.get("router") and restarted & {"prefill", "decode"}:
        own = [str(i["worker"]) for i in state["instances"] if i.get("role") == "prefill"]
        # the host's own pools (behind fleet routers: peers())
        restart_gate.recheck_peers(state, own)


def peers(state_dir: Path, doc: dict[str, Any]) -> int:
    """A decode host behind fleet routers, after a host of its run restarted servers: its
    decodes re-checked against the run's prefills (``doc``: the host's desired state and
    ``prefills``, their base URLs; from stdin)."""
    with state_files.state_lock(state_dir):
        try:
            restart_gate.recheck_peers(doc, [str(p) for p in doc.get("prefills") or []])
        except systemd_units.Failed as failure:
            report(failure)
            return 1
    return 0


def restore(state_dir: Path, target: dict[str, Any]) -> None:
    """Unit files, ``current`` and running instances back to ``target``, through the gate."""
    instances = state_files.kept_instances(state_dir, target)
    wanted = {i["unit"] for i in instances}
    unit_dir = systemd_units.UNIT_DIR
    extra = [p.name for p in unit_dir.glob(layout.UNIT_GLOB) if p.name not in wanted]
    bring_to({**target, "instances": instances, "stale": extra})
    state_files.point_current(state_dir.parent, target["release"])


def converge(desired_file: Path) -> int:
    desired = json.loads(desired_file.read_text())
    state_dir = desired_file.parent
    try:
        bring_to(desired)
        state_files.keep_units(state_dir, desired)
        state_files.record_good(state_dir, desired)
        state_files.clean_up(state_dir)
        if desired.get("cache_root"):
            warm_state.sweep(desired["cache_root"])  # what a killed cache drop left
            fps = [str(i.get("fingerprint") or "") for i in desired["instances"]]
            warm_state.seal_warm(desired["cache_root"], fps)  # one sealed before #36
        return 0
    except systemd_units.Failed as failure:
        report(failure)
    good = state_files.load(state_dir / layout.GOOD)
    if good is None:
        print("servefleet: no earlier good state on this host to roll back to", file=sys.stderr)
        return 1
    try:
        restore(state_dir, good)
    except systemd_units.Failed as again:
        report(again)
        print(f"servefleet: rolling back to {good['release']} failed too", file=sys.stderr)
        return 1
    print(f"servefleet: rolled back to {good['release']}", file=sys.stderr)
    return 1


def report(failure: systemd_units.Failed) -> None:
    unit = str(failure).split(": ")[1] if str(failure).startswith("health gate: ") else ""
    sys.stderr.write(f"servefleet: {failure}\n")
    if failure.journal:
        sys.stderr.write(f"--- journal tail of {unit} ---\n{failure.journal}")
    sys.stderr.flush()


def router_only(state: dict[str, Any]) -> int:
    """A fleet router host (it serves nothing): its router as ``state`` says, through its gate
    (``state``: ``router``, ``model``, ``host``, ``health_timeout``, ``keyless``; from stdin)."""
    try:
        rotation.bring_router({**state, "instances": []})
    except systemd_units.Failed as failure:
        report(failure)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "current":
        state_files.point_current(Path(argv[1]), argv[2])
        return 0
    if argv == ["router", "-"]:
        return router_only(json.load(sys.stdin))
    if len(argv) == 3 and argv[0] == "peers" and argv[2] == "-":
        return peers(Path(argv[1]), json.load(sys.stdin))
    if len(argv) != 2 or argv[0] not in ("converge", "restore", "rollback"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    command, arg = argv
    with state_files.state_lock(Path(arg).parent if command == "converge" else Path(arg)):
        return locked(command, arg)


def locked(command: str, arg: str) -> int:
    if command == "converge":
        return converge(Path(arg))
    state_dir = Path(arg)
    good = state_files.load(state_dir / layout.GOOD)
    previous = state_files.load(state_dir / layout.PREVIOUS)
    target = good if command == "restore" else previous
    if target is None:
        which = "good" if command == "restore" else "previous"
        print(f"servefleet: no {which} state on this host; nothing to {command}", file=sys.stderr)
        return 0 if command == "restore" else 1
    try:
        restore(state_dir, target)
    except systemd_units.Failed as failure:
        report(failure)
        return 1
    if command == "rollback":
        assert good is not None
        state_files.record_rollback(state_dir, good, target)
        state_files.clean_up(state_dir)
        print(f"servefleet: rolled back to {target['release']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
